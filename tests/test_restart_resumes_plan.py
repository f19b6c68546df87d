"""kill -9 of the controller in the middle of an adaptive run, then a restart: the first
control step brings back the same allocation (CPU weights, workers, throttles) from the
state file's wanted/applied record and learnt models, with no even-share interlude.

Real controller processes, real cgroups (v1 cpu.shares), real jobs that keep running
through the outage (reliability/job.py under ``adloader run``). The jobs are paused
(SIGSTOP) from just before the kill until the restarted controller has answered, so no
report of theirs reaches it: what its status shows of their models (M, p, b, the
loading curve) can only have come back from the state file."""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from typing import Callable, NamedTuple

import pytest

from adloader.protocol import JobSnapshot, NodeSnapshot
from bench.controller_process import ControllerProcess, JobProcess, wait_until
from controller.policies import NodeResources, make_policy
from controller.policies.base import JobView
from controller.state import LearntModel, StateStore
from throughput_model.curves import LoadingCurveEstimator

pytestmark = [pytest.mark.real_cgroups, pytest.mark.end_to_end]

PERIOD = 0.5
RELEARN_PERIODS = 12
"""Periods a job needs after reconnecting before its own windows make a loading curve
(warm-up plus MIN_OBSERVATIONS), with slack."""
JOB = (sys.executable, "-m", "reliability.job", "--seconds", "300", "--report-every", "0.2")


def _plan(status: NodeSnapshot) -> dict[str, tuple[int | None, int | None, int | None]]:
    """Each job's applied (cpu_weight, workers target, read throttle)."""
    return {job.job_id: (job.cpu_weight, job.workers_target, job.read_bps) for job in status.jobs}


class Shown(NamedTuple):
    """What status shows of a job's learnt model."""

    max_sps: float | None
    cpu_s_per_sample: float | None
    bytes_per_sample: float | None
    loading_curve: tuple[tuple[float, float], ...]


def _shown(job: JobSnapshot) -> Shown:
    return Shown(job.max_sps_measured, job.cpu_s_per_sample, job.bytes_per_sample, job.loading_curve)


def _as_shown(saved: LearntModel) -> Shown:
    """A saved model as status would show it: the loading curve fitted to the saved windows."""
    curve = LoadingCurveEstimator()
    curve.resume(saved.loading_observations)
    return Shown(saved.max_throughput, saved.cpu_s_per_sample, saved.bytes_per_sample, curve.points())


def _pause(jobs: list[JobProcess], signum: int) -> None:
    """SIGSTOP or SIGCONT each launcher's session: the launcher and its training command."""
    for job in jobs:
        os.killpg(job.pid, signum)


def _planned_from_models(controller: ControllerProcess) -> NodeSnapshot | None:
    """The status once adaptive has re-planned from both jobs' measured models (a "gain"
    reallocation after the arrivals) and every job reports its measured M."""
    status = controller.status()
    modelled = len(status.jobs) == 2 and all(j.max_sps_measured and j.cpu_weight for j in status.jobs)
    return status if modelled and status.reallocations_total.get("gain") else None


def test_a_restarted_controller_resumes_the_adaptive_plan_at_its_first_step(
    start_controller: Callable[..., ControllerProcess],
) -> None:
    controller = start_controller("--policy", "adaptive", "--cpus", "0", period=PERIOD)
    # Two jobs whose loading needs more than the one CPU between them; the one with 4 GPUs
    # should get most of it: a plan unlike even shares.
    big = controller.run(*JOB, "--step-s", "0.02", "--load-rounds", "3000", name="big", options=("--gpus", "4"))
    small = controller.run(*JOB, "--step-s", "0.01", "--load-rounds", "3000", name="small")
    ids = [controller.registered(job).job_id for job in (big, small)]
    before = wait_until(lambda: _planned_from_models(controller), 60, "adaptive to plan from measured models")
    plan = _plan(before)
    shares = {job_id: controller.read("cpu", job_id, "cpu.shares") for job_id in ids}

    # What adaptive gives the same jobs when it knows nothing of them: the interlude this test rules out.
    unmodelled = make_policy("adaptive").allocate(
        NodeResources(cpus=(0,)), [JobView(job_id=job.job_id, name=job.name, arrival_s=i)
                                   for i, job in enumerate(before.jobs)])
    even = {job_id: (a.cpu_weight, a.workers, a.read_bps) for job_id, a in unmodelled.items()}
    assert plan != even, "the jobs' models should have moved the plan away from even shares"

    _pause([big, small], signal.SIGSTOP)
    try:
        controller.kill()
        saved = StateStore(controller.state_dir).load().state
        assert saved is not None, "the killed controller left no state file"
        learnt = {job_id: _as_shown(saved.jobs[job_id].model) for job_id in ids}
        for job_id, model in learnt.items():
            assert model.max_sps and model.loading_curve, (job_id, model, "nothing learnt was saved")
        log_before = len(controller.log())
        controller.start()  # answers only after its first control step: status shows that step
        after = controller.status()
    finally:
        _pause([big, small], signal.SIGCONT)
    # No report from the paused jobs has been measured by this controller, yet its status
    # shows their M, p, b and loading curve as the killed controller had learnt them.
    assert all(job.ranks_reporting == 0 for job in after.jobs), after.jobs
    assert {job.job_id: _shown(job) for job in after.jobs} == learnt
    assert _plan(after) == plan
    assert {job_id: controller.read("cpu", job_id, "cpu.shares") for job_id in ids} == shares
    assert after.reallocations_total == {"adoption": 1}
    decisions = re.findall(r"job (j[0-9a-f]{8}) \(.*\): (.*) \(policy adaptive, reason: (\w+)\)",
                           controller.log()[log_before:])
    assert {job_id for job_id, _, _ in decisions} == set(ids)
    assert {reason for _, _, reason in decisions} == {"adoption"}, decisions
    for job_id, change, _ in decisions:
        assert f"cpu_weight unset -> {plan[job_id][0]}" in change, (job_id, change, plan)
    # The jobs report again on fresh connections; until this controller has measured them
    # itself (a loading curve needs several windows), the models it restored stand in: the
    # plan never falls back to even shares meanwhile.
    for _ in range(RELEARN_PERIODS):
        time.sleep(PERIOD)
        assert _plan(controller.status()) != even, controller.log()[log_before:]
    assert big.proc.poll() is None and small.proc.poll() is None
