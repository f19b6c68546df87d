"""The in-process tier: a whole ``Controller`` built in the test process on the cgroup v2
fixture tree, with an injected clock; no root, no subprocess, no socket. Controller logic
(recovery from the state file, the control step, reports, the snapshot) in milliseconds.

Select it with ``pytest -m in_process``."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from adloader import protocol
from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.policies.worth import MATURE_CURVE_WINDOWS
from controller.daemon import Controller, ControllerConfig
from controller.peer import PeerCredentials
from controller.policies import JobAllocation, NodeResources, make_policy
from controller.policies.base import JobView
from controller.server import Connection
from controller.state import STATE_VERSION, ControllerState, LearntModel, PersistedJob, StateStore
from fixtures.cgroup2_tree import make_cgroup2_tree

pytestmark = pytest.mark.in_process

GROUP = "adloader"
CPUS = (0, 1)
MODELS = {  # (gpus, M samples/s, loading windows (cores used, samples/s)): j1 needs 1.5 cores, j2 0.25
    "j1000000a": (4, 600.0, ((1.0, 400.0),) * 8),
    "j1000000b": (1, 500.0, ((0.5, 1000.0),) * 8),
}


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def _saved_plan() -> dict[str, JobAllocation]:
    """What adaptive decides for the jobs of MODELS (the plan an earlier controller had applied)."""
    views = [JobView(job_id=job_id, name=job_id, gpus=gpus, max_throughput=m, loading_curve=(curve[0],),
                     arrival_s=float(i))
             for i, (job_id, (gpus, m, curve)) in enumerate(MODELS.items())]
    return dict(make_policy("adaptive").allocate(NodeResources(cpus=CPUS), views))


def _controller(tmp_path: Path, clock: Clock, backend_class: type[CgroupV2Backend] = CgroupV2Backend,
                ) -> tuple[Controller, Path]:
    root = make_cgroup2_tree(tmp_path / "cg", GROUP, MODELS)
    for job_id in MODELS:  # a live process in each job's group: this test process
        (root / GROUP / job_id / "cgroup.procs").write_text(f"{os.getpid()}\n")
    config = ControllerConfig(socket_path=tmp_path / "s.sock", state_dir=tmp_path / "state", cpus=CPUS,
                              policy="adaptive", group=GROUP, cgroup_root=root, lock_dir=tmp_path / "locks")
    backend = backend_class(group=GROUP, root=root)
    return Controller(config, backend=backend, clock=clock), root


def _save_earlier_run(state_dir: Path, plan: dict[str, JobAllocation], windows: int = 8) -> None:
    jobs = {
        job_id: PersistedJob(
            job_id=job_id, name=job_id, uid=0, gpus=gpus, launcher_pid=os.getpid(), registered_at=1.7e9,
            cgroup="", wanted=plan[job_id], applied=plan[job_id], requested_workers=None, features=None,
            model=LearntModel(max_throughput=m, cpu_s_per_sample=None, loading_observations=curve[:windows]),
        )
        for job_id, (gpus, m, curve) in MODELS.items()
    }
    StateStore(state_dir).save(ControllerState(version=STATE_VERSION, policy="adaptive", jobs=jobs, saved_at=0.0))


def test_a_controller_resumes_the_saved_plan_and_models_at_its_first_step(tmp_path: Path) -> None:
    plan = _saved_plan()
    assert len({a.cpu_weight for a in plan.values()}) == 2  # not an even split
    clock = Clock()
    controller, root = _controller(tmp_path, clock)
    _save_earlier_run(controller.config.state_dir, plan)

    controller.recover()
    controller.step()

    for job_id, allocation in plan.items():
        assert (root / GROUP / job_id / "cpu.weight").read_text().strip() == str(allocation.cpu_weight)
    snapshot = controller.snapshot()
    assert {j.job_id: (j.cpu_weight, j.workers_target, j.failed_to_apply) for j in snapshot.jobs} == {
        job_id: (a.cpu_weight, a.workers, {}) for job_id, a in plan.items()}
    assert {j.job_id: j.max_sps_measured for j in snapshot.jobs} == {k: m for k, (_, m, _) in MODELS.items()}
    assert snapshot.reallocations_total == {"adoption": 1}


def test_reports_are_measured_once_per_step_on_the_injected_clock(tmp_path: Path) -> None:
    clock = Clock()
    controller, _ = _controller(tmp_path, clock)
    _save_earlier_run(controller.config.state_dir, _saved_plan())
    controller.recover()
    controller.step()
    job_id = next(iter(MODELS))
    _report_twice(controller, clock, job_id)
    before_step = next(j for j in controller.snapshot().jobs if j.job_id == job_id)
    assert before_step.achieved_sps is None  # the snapshot is the last step's measurement
    controller.step()
    measured = next(j for j in controller.snapshot().jobs if j.job_id == job_id)
    assert measured.achieved_sps == pytest.approx(3200 / 2.0)
    assert measured.max_sps_measured == pytest.approx(800.0)  # its own M replaces the restored one


def _report_twice(controller: Controller, clock: Clock, job_id: str) -> None:
    """Two reports of ``job_id`` two seconds apart: 3200 samples, M 800/s."""
    connection = Connection(peer=PeerCredentials(pid=os.getpid(), uid=0, gid=0))
    for samples in (0, 3200):
        reply = controller.handle(protocol.Report(job_id=job_id, batch_size=32, samples=samples,
                                                  batches=samples // 32, compute_s=samples / 800), connection)
        assert isinstance(reply, protocol.Target) and reply.num_workers is not None
        clock.now += 2.0


class _CountingBackend(CgroupV2Backend):
    """The real fixture-tree backend, counting how often each job's cgroup.procs is read."""

    reads: dict[str, int]

    def __init__(self, group: str, root: Path) -> None:
        super().__init__(group=group, root=root)
        self.reads = {}

    def pids(self, job_id: str) -> set[int]:
        self.reads[job_id] = self.reads.get(job_id, 0) + 1
        return super().pids(job_id)


def test_a_step_reads_each_jobs_processes_once_for_its_decision_and_its_snapshot(tmp_path: Path) -> None:
    """cgroup.procs was read again for the published snapshot: a sixth of a 16-job node's
    controller CPU. The snapshot takes the processes the step read; the reaper still reads a
    job whose launcher is gone (to see whether any of its processes is left)."""
    controller, _ = _controller(tmp_path, Clock(), _CountingBackend)
    backend = controller.backend
    assert isinstance(backend, _CountingBackend)
    _save_earlier_run(controller.config.state_dir, _saved_plan())
    controller.recover()
    backend.reads.clear()
    controller.step()
    reaper_reads = {job.job_id: int(not (job.connected and not job.ended)) for job in controller.registry}
    assert backend.reads == {job_id: 1 + reaper_reads[job_id] for job_id in MODELS}
    assert {job.job_id: job.pids for job in controller.snapshot().jobs} == {job_id: (os.getpid(),) for job_id in MODELS}


def test_the_controller_steps_at_its_settle_period_while_a_reporting_jobs_curve_is_young(tmp_path: Path) -> None:
    """Until its first step the controller counts the node as settling; then it steps every
    settle period only while a job that reports has a curve on fewer than MATURE_CURVE_WINDOWS
    windows (restored here with fewer), every period otherwise."""
    for windows, reporting, period in ((MATURE_CURVE_WINDOWS, True, "period_s"),
                                       (MATURE_CURVE_WINDOWS - 4, False, "period_s"),
                                       (MATURE_CURVE_WINDOWS - 4, True, "settle_period_s")):
        clock = Clock()
        controller, _ = _controller(tmp_path / f"{windows}-{reporting}", clock)
        _save_earlier_run(controller.config.state_dir, _saved_plan(), windows=windows)
        controller.recover()
        assert controller.next_period_s() == controller.config.settle_period_s < controller.config.period_s
        if reporting:
            _report_twice(controller, clock, next(iter(MODELS)))
        controller.step()
        assert controller.next_period_s() == getattr(controller.config, period), (windows, reporting)
