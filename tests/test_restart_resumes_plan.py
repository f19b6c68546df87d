"""kill -9 of the controller in the middle of an adaptive run, then a restart: the first
control step brings back the same allocation (CPU weights, workers, throttles) from the
state file's wanted/applied record and learnt models, with no even-share interlude.

Real controller processes, real cgroups (v1 cpu.shares), real jobs that keep reporting
through the outage (reliability/job.py under ``adloader run``)."""
from __future__ import annotations

import re
import sys
import time
from typing import Callable

import pytest

from adloader.protocol import NodeSnapshot
from controller.policies import NodeResources, make_policy
from controller.policies.base import JobView
from bench.controller_process import ControllerProcess, wait_until

pytestmark = [pytest.mark.real_cgroups, pytest.mark.end_to_end]

PERIOD = 0.5
RELEARN_PERIODS = 12
"""Periods a job needs after reconnecting before its own windows make a loading curve
(warm-up plus MIN_OBSERVATIONS), with slack."""
JOB = (sys.executable, "-m", "reliability.job", "--seconds", "300", "--report-every", "0.2")


def _plan(status: NodeSnapshot) -> dict[str, tuple[int | None, int | None, int | None]]:
    """Each job's applied (cpu_weight, workers target, read throttle)."""
    return {job.job_id: (job.cpu_weight, job.workers_target, job.read_bps) for job in status.jobs}


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

    controller.kill()
    log_before = len(controller.log())
    controller.start()  # answers only after its first control step: status shows that step
    after = controller.status()
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
