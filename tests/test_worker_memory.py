"""Workers that fit in a job's memory, on real cgroup v1 memory groups and real processes.

The measurement (workers' USS, their share of shared memory, the tightest limit from the
job's group up, the node reserve) is checked against processes whose memory the test
knows; end to end, a real controller under ``adaptive`` gives a loader job in a
memory-limited group fewer workers than it would otherwise, says why in its log, and
the job finishes without an OOM kill.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from controller.policies import JobView
from controller.worker_memory import WorkerMemory, read_meminfo
from bench.controller_process import REPO, ControllerProcess, JobProcess, base_environment, wait_until

MEMORY = Path("/sys/fs/cgroup/memory")
MIB = 1 << 20
LOADED = {"steady_workers": 2, "window_batches": 8.0}
"""A job whose two workers each delivered batches over its last window, steady: its cost may settle."""
NO_MEMORY_CGROUP = "needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory"
pytestmark = pytest.mark.skipif(
    not (MEMORY / "memory.limit_in_bytes").exists() or not __import__("os").access(MEMORY, __import__("os").W_OK),
    reason=NO_MEMORY_CGROUP,
)

# A parent that forks WORKERS children holding MB private MiB each, all in the group at GROUP.
FORKING = """
import os, sys, time
group, workers, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
open(os.path.join(group, "cgroup.procs"), "w").write(str(os.getpid()))
for _ in range(workers):
    if os.fork() == 0:
        ballast = bytearray(mb << 20)
        ballast[::4096] = b"\\1" * len(range(0, len(ballast), 4096))
        time.sleep(120)
        os._exit(0)
print("ready", flush=True)
time.sleep(120)
"""


def _group(path: Path, limit: int | None = None) -> Path:
    path.mkdir()
    if limit is not None:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        (path / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no swap to hide in: over it is an OOM
    return path


def _remove(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir():
            _drain(child)
            child.rmdir()
    if path.exists():
        _drain(path)
        path.rmdir()


def _drain(group: Path) -> None:
    deadline = time.monotonic() + 10
    while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
        for pid in (group / "cgroup.procs").read_text().split():
            subprocess.run(["kill", "-9", pid], check=False)
        time.sleep(0.1)


@pytest.fixture
def memory_group() -> Iterator[Path]:
    path = MEMORY / f"adloader-test-{uuid.uuid4().hex[:8]}"
    yield path
    if path.exists():
        _remove(path)


def _pids(group: Path) -> set[int]:
    return {int(pid) for path in [group, *group.rglob("*")] if path.is_dir()
            for pid in (path / "cgroup.procs").read_text().split()}


def _forking(group: Path, workers: int, mb: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", FORKING, str(group), str(workers), str(mb)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    wait_until(lambda: len(_pids(group)) == workers + 1, 10, "the workers in the group")
    wait_until(lambda: int((group / "memory.usage_in_bytes").read_text()) > workers * mb * MIB, 20,
               "the workers to touch their memory")
    return proc


def test_worker_uss_and_the_tightest_limit_up_the_tree_are_measured(memory_group: Path) -> None:
    # the scheduler's group limits the job to 1 GiB; the job's own group below it sets none
    scheduler = _group(memory_group, limit=1024 * MIB)
    job = _group(scheduler / "job")
    proc = _forking(job, workers=2, mb=100)
    try:
        pids = _pids(job)
        memory = WorkerMemory(reserve_bytes=0)
        first = memory.verdict(JobView(job_id="j", name="forks", ranks=1, **LOADED), pids)
        assert first is not None and first.max_workers_per_rank == 2  # first sight: none added yet
        verdict = memory.verdict(JobView(job_id="j", name="forks", ranks=1, **LOADED), pids)  # its cost held still
        assert verdict is not None
        assert verdict.cost.workers == 2  # the forks, not the parent
        assert 100 * MIB <= verdict.cost.uss_bytes < 140 * MIB
        assert str(scheduler) in verdict.room.limited_by and "1024 MiB" in verdict.room.limited_by
        used = float((scheduler / "memory.usage_in_bytes").read_text())
        assert 0 < verdict.room.bytes <= 1024 * MIB - used + 64 * MIB
        margin = max(32 * MIB, 0.1 * verdict.room.bytes)
        assert verdict.max_workers_per_rank == 2 + int((verdict.room.bytes - margin) // verdict.cost.per_worker)
        assert 4 <= verdict.max_workers_per_rank <= 9  # ~800 MiB of room at ~100 MiB a worker
        # two ranks share the job's workers
        assert memory.verdict(JobView(job_id="j", name="forks", ranks=2, **LOADED), pids).max_workers_per_rank == \
            verdict.max_workers_per_rank // 2
        # a node reserve that leaves less room than the groups do is the tighter limit
        available = read_meminfo()["MemAvailable"]
        reserve = WorkerMemory(reserve_bytes=available - 150 * MIB)
        reserve.verdict(JobView(job_id="j", name="f", **LOADED), pids)
        reserved = reserve.verdict(JobView(job_id="j", name="f", **LOADED), pids)
        assert reserved is not None and reserved.room.limited_by.startswith("node")
        assert reserved.max_workers_per_rank <= 3
    finally:
        proc.kill()
        proc.wait()


def test_a_workers_cost_settles_only_once_each_worker_has_loaded_or_after_the_hold(memory_group: Path) -> None:
    """A worker that has not yet touched its dataset holds little however long it sits: its cost
    is held growing (no worker added) until a steady window shows a batch delivered per worker,
    or UNLOADED_HOLD_S after the job's workers were first measured."""
    from controller.worker_memory import UNLOADED_HOLD_S

    group = _group(memory_group, limit=1024 * MIB)
    proc = _forking(group, workers=2, mb=100)
    try:
        pids = _pids(group)
        clock = [0.0]
        memory = WorkerMemory(reserve_bytes=0, clock=lambda: clock[0])
        starting = JobView(job_id="j", name="forks", steady_workers=2, window_batches=1.0)  # one batch, two workers
        for _ in range(3):
            verdict = memory.verdict(starting, pids)
            assert verdict is not None and verdict.growing and verdict.max_workers_per_rank == 2
            clock[0] += 2.0
        settled = memory.verdict(JobView(job_id="j", name="forks", **LOADED), pids)
        assert settled is not None and not settled.growing and settled.max_workers_per_rank > 2
        assert memory.verdict(starting, pids).max_workers_per_rank == settled.max_workers_per_rank  # it stays
        slow = WorkerMemory(reserve_bytes=0, clock=lambda: clock[0])
        unsteady = JobView(job_id="j", name="forks", steady_workers=None, window_batches=50.0)  # count changed
        clock[0] = 0.0
        assert slow.verdict(unsteady, pids).growing
        clock[0] = UNLOADED_HOLD_S - 1
        assert slow.verdict(unsteady, pids).growing
        clock[0] = UNLOADED_HOLD_S
        assert not slow.verdict(unsteady, pids).growing
    finally:
        proc.kill()
        proc.wait()


def test_a_cap_is_logged_at_info_once_and_only_when_it_decides_something(
    memory_group: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 1 GiB group with two 100 MiB workers fits 4-9 workers: said once at INFO after the
    workers' cost holds still (not while it may still grow, not again when unchanged); under
    a ceiling the policies never pass anyway (4 here) it decides nothing and stays at DEBUG."""
    group = _group(memory_group, limit=1024 * MIB)
    proc = _forking(group, workers=2, mb=100)
    view = JobView(job_id="j", name="forks", ranks=1, **LOADED)
    try:
        for ceiling, infos in ((32, 1), (4, 0)):
            memory = WorkerMemory(reserve_bytes=0, refresh_s=0.0, ceiling_per_rank=ceiling)
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="controller.worker_memory"):
                for _ in range(4):
                    memory.annotate([view], {"j": _pids(group)})
            said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
            assert len(said) == infos, said
            assert len(caplog.records) == 4  # every measurement is still there at DEBUG
            assert "still grows" in caplog.records[0].getMessage()
            if infos:
                assert "job j (forks): memory fits" in said[0] and "still grows" not in said[0]
    finally:
        proc.kill()
        proc.wait()


class _CountingReads(WorkerMemory):
    """WorkerMemory counting its smaps_rollup reads (the expensive ones), on the real /proc."""

    reads = 0

    def _rollup(self, pid: int) -> dict[str, int] | None:
        self.reads += 1
        return super()._rollup(pid)


def test_a_settled_worker_cost_is_not_read_again_until_the_processes_change(memory_group: Path) -> None:
    group = _group(memory_group, limit=1024 * MIB)
    proc = _forking(group, workers=2, mb=100)
    view = JobView(job_id="j", name="forks", **LOADED)
    try:
        clock = [0.0]
        memory = _CountingReads(reserve_bytes=0, clock=lambda: clock[0])
        pids = _pids(group)
        first, settled = memory.verdict(view, pids), memory.verdict(view, pids)
        assert first is not None and first.growing and settled is not None and not settled.growing
        reads = memory.reads
        assert reads == 2 * len(pids)  # each process once per measurement
        for _ in range(5):
            clock[0] += 2.0
            assert memory.verdict(view, pids).max_workers_per_rank == settled.max_workers_per_rank
        assert memory.reads == reads  # the same processes, settled: no smaps read
        memory.verdict(view, pids - {max(pids)})  # a worker left (a resize): measured at once
        assert memory.reads > reads
        reads = memory.reads
        clock[0] += 60.0
        memory.verdict(view, pids - {max(pids)})
        assert memory.reads > reads  # and again once COST_REFRESH_S has passed
    finally:
        proc.kill()
        proc.wait()


class _CountingGroupReads(WorkerMemory):
    """WorkerMemory counting the /proc/PID/cgroup reads that find a process's memory group."""

    group_reads = 0

    def _memory_group(self, pid: int) -> Path | None:
        self.group_reads += 1
        return super()._memory_group(pid)


def test_what_a_process_is_is_read_once_per_cost_refresh_and_shared_by_a_pass(memory_group: Path) -> None:
    """A process's parent, command line and memory group are read once (again after
    COST_REFRESH_S); two jobs in one pass read the node's values once; the room stays right."""
    from controller.worker_memory import COST_REFRESH_S

    group = _group(memory_group, limit=1024 * MIB)
    proc = _forking(group, workers=2, mb=100)
    clock = [0.0]
    memory = _CountingGroupReads(reserve_bytes=0, clock=lambda: clock[0])
    pids = sorted(_pids(group))
    views = [JobView(job_id="parent-and-one", name="a", **LOADED), JobView(job_id="other", name="b", **LOADED)]
    split = {"parent-and-one": set(pids[:2]), "other": set(pids[2:])}
    try:
        memory.annotate(views, split)  # the first measurement: its workers may still be filling up
        clock[0] += memory.refresh_s
        capped = memory.annotate(views, split)
        assert memory.group_reads == len(pids)
        for _ in range(3):
            clock[0] += memory.refresh_s
            assert [v.max_workers for v in memory.annotate(views, split)] == [v.max_workers for v in capped]
        assert memory.group_reads == len(pids)  # the same processes: not read again
        assert all(verdict.room.limited_by.startswith(str(group)) for verdict in
                   (memory.verdict(view, split[view.job_id]) for view in views) if verdict is not None)
        clock[0] += COST_REFRESH_S
        memory.annotate(views, split)
        assert memory.group_reads == 2 * len(pids)
    finally:
        proc.kill()
        proc.wait()


def test_a_roomy_job_is_judged_from_a_cheap_upper_bound_without_reading_smaps(memory_group: Path) -> None:
    """2 GiB of room, two ~100 MiB workers, a ceiling of 2 workers per rank: even at the bound
    (a worker's whole RSS) twice the ceiling fits, so its cap is judged from the bound and stays
    above the ceiling; smaps_rollup is read only for reports, 60 s after the workers are first
    seen and then ever more rarely. At a ceiling of 32 the room is tight and the exact cost is read."""
    from controller.worker_memory import ROOMY_REPORT_S

    group = _group(memory_group, limit=2048 * MIB)
    proc = _forking(group, workers=2, mb=100)
    view = JobView(job_id="j", name="forks", **LOADED)
    try:
        clock = [0.0]
        roomy = _CountingReads(reserve_bytes=0, ceiling_per_rank=2, clock=lambda: clock[0])
        verdict = roomy.verdict(view, _pids(group))
        assert verdict is not None and verdict.cost.upper_bound and not verdict.growing
        assert roomy.reads == 0 and verdict.measured is None and verdict.shown is verdict.cost
        assert 100 * MIB <= verdict.cost.uss_bytes  # the bound is never below what a worker holds
        assert verdict.max_workers_per_rank >= 2 * 2
        clock[0] += ROOMY_REPORT_S[0]
        reported = roomy.verdict(view, _pids(group))
        assert reported is not None and roomy.reads > 0
        assert reported.measured is not None and not reported.measured.upper_bound
        assert 100 * MIB <= reported.shown.uss_bytes < reported.cost.uss_bytes  # exact: below the bound
        assert reported.max_workers_per_rank == verdict.max_workers_per_rank  # the cap still from the bound
        reads = roomy.reads
        clock[0] += ROOMY_REPORT_S[0] - 1
        assert roomy.verdict(view, _pids(group)).shown == reported.shown and roomy.reads == reads  # not due
        clock[0] += 1
        roomy.verdict(view, _pids(group))
        assert roomy.reads > reads  # due again a first interval on, then twice that ... up to ROOMY_REPORT_S[1]
        tight = _CountingReads(reserve_bytes=0, ceiling_per_rank=32)
        exact = tight.verdict(view, _pids(group))
        assert exact is not None and not exact.cost.upper_bound and tight.reads > 0
        assert exact.cost.per_worker <= verdict.cost.per_worker
    finally:
        proc.kill()
        proc.wait()


def test_a_job_with_no_worker_yet_gets_no_more_workers_than_it_asked_for(memory_group: Path) -> None:
    group = _group(memory_group, limit=512 * MIB)
    proc = _forking(group, workers=0, mb=0)
    try:
        view = JobView(job_id="j", name="no-workers", requested_workers=3)
        (annotated,) = WorkerMemory(reserve_bytes=0).annotate([view], {"j": _pids(group)})
        assert annotated.max_workers == 3
    finally:
        proc.kill()
        proc.wait()


def _working_set(group: Path) -> int:
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return int((group / "memory.usage_in_bytes").read_text()) - int(stat["total_inactive_file"])


def test_a_job_whose_workers_would_exceed_its_limit_gets_fewer_and_is_never_oom_killed(
    memory_group: Path, start_controller: Callable[..., ControllerProcess], tmp_path: Path,
) -> None:
    worker_mb = 200
    job_command = (sys.executable, str(REPO / "tests" / "loader_job.py"), "--out", str(tmp_path / "out"),
                   "--workers", "1", "--worker-mb", str(worker_mb), "--compute-s", "0", "--samples", "200",
                   "--batch-size", "4", "--seconds", "600", "--stop-file", str(tmp_path / "stop"))

    def in_group(group: Path) -> tuple[str, ...]:
        return ("sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *job_command)

    # how much the job holds with its one worker, measured in a group of its own without a limit
    calibration = _group(memory_group)
    probe = subprocess.Popen(in_group(calibration), cwd=REPO, env=base_environment())
    try:
        wait_until(lambda: _working_set(calibration) > worker_mb * MIB and (tmp_path / "out").parent.exists(),
                   120, "the calibration job's worker to hold its memory")
        time.sleep(3)
        base = _working_set(calibration)
    finally:
        probe.kill()
        probe.wait()
    _drain(calibration)
    calibration.rmdir()
    # room for one more worker, not for the three adaptive gives a lone loading-bound job on two cores
    limited = _group(memory_group, limit=int(base + 1.5 * worker_mb * MIB + 40 * MIB))

    controller = start_controller("--policy", "adaptive", "--cpus", "0-1", "--memory-reserve", "0")
    job: JobProcess = controller.run(*in_group(limited), name="memory-bound")
    snapshot = controller.registered(job, timeout=60)
    wait_until(lambda: "memory fits" in controller.log(), 90, "the controller to measure the job's workers")
    time.sleep(8)  # a few control periods with the cap in force
    seen = controller.job(snapshot.job_id)
    assert seen is not None and seen.workers_memory_limit == 2  # status and /metrics show the cap
    # ... and what a worker costs: the MB it holds alone, read exactly (the job has no room to spare)
    assert seen.worker_memory_exact is True
    assert seen.worker_memory_bytes is not None and worker_mb * MIB <= seen.worker_memory_bytes < 2 * worker_mb * MIB
    assert seen.worker_prefetch_bytes is not None and 0 <= seen.worker_prefetch_bytes < seen.worker_memory_bytes
    assert seen.workers_target is not None and seen.workers_target <= 2
    (tmp_path / "stop").write_text("")
    assert job.wait(timeout=120) == 0, job.output()
    log = controller.log()
    assert f"job {snapshot.job_id} (memory-bound): memory fits 2 workers per rank" in log, log
    assert "oom_kill 0" in (limited / "memory.oom_control").read_text(), (log, job.output())
    final = (tmp_path / "out" / "rank0.json").read_text()
    assert '"num_workers": 2' in final or '"num_workers": 1' in final, final
