"""The control step never waits on a job's memory map: with an executor, WorkerMemory reads
/proc there and the step goes on with what it knew.

A fixture /proc tree (the module's ``proc`` root) holds a job of two processes whose
worker's smaps_rollup is a FIFO: reading it blocks until the test writes it, as reading a
real one blocks while the job holds its memory map (forking its workers on a starved CPU).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from controller.policies import JobView
from controller.worker_memory import WorkerMemory

MIB = 1 << 20
PARENT, WORKER = 100, 101


def _process(proc: Path, pid: int, ppid: int, rss_mib: int) -> Path:
    root = proc / str(pid)
    root.mkdir(parents=True)
    (root / "cmdline").write_bytes(b"python3\0train.py\0")
    (root / "stat").write_text(f"{pid} (python3) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0\n")
    (root / "status").write_text(f"Name:\tpython3\nVmRSS:\t{rss_mib * 1024} kB\nRssShmem:\t0 kB\n")
    (root / "cgroup").write_text("")
    return root


def _tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    # 1 GiB available: 32 workers of 100 MiB do not fit twice over, so the exact cost is read
    proc.mkdir()
    (proc / "meminfo").write_text(f"MemTotal: {4 << 20} kB\nMemAvailable: {1 << 20} kB\n")
    (_process(proc, PARENT, 1, rss_mib=300) / "smaps_rollup").write_text(
        "00400000-7fff [rollup]\nPrivate_Clean: 0 kB\nPrivate_Dirty: 204800 kB\nPss_Shmem: 0 kB\n")
    os.mkfifo(_process(proc, WORKER, PARENT, rss_mib=100) / "smaps_rollup")
    return proc


def test_a_step_goes_on_while_a_jobs_memory_map_is_held_and_takes_the_verdict_once_read(tmp_path: Path) -> None:
    proc = _tree(tmp_path)
    view = JobView(job_id="j", name="forking", requested_workers=3, steady_workers=1, window_batches=4.0)
    pids = {"j": {PARENT, WORKER}}
    fifo = proc / str(WORKER) / "smaps_rollup"
    release = threading.Thread(target=fifo.write_text, args=(
        "00400000-7fff [rollup]\nPrivate_Clean: 0 kB\nPrivate_Dirty: 102400 kB\nPss_Shmem: 0 kB\n",))
    reads = ThreadPoolExecutor(max_workers=1)
    try:
        memory = WorkerMemory(reserve_bytes=0, proc=proc, cgroup_root=tmp_path / "cgroup", refresh_s=60.0,
                              executor=reads)
        # the worker's smaps_rollup blocks: every step answers at once, with what the job asked for
        steps = [memory.annotate([view], pids)[0].max_workers for _ in range(3)]
        release.start()
        reads.submit(lambda: None).result(timeout=30)  # the measurement ahead of it has finished
        (measured,) = memory.annotate([view], pids)
    finally:
        if release.ident is None:
            release.start()  # never leave the reader blocked
        release.join(timeout=30)
        reads.shutdown(wait=True)
    assert steps == [3, 3, 3]
    # measured: its one worker, held there while its first measured cost may still grow
    assert measured.max_workers == 1


def test_a_roomy_job_is_measured_again_less_often(tmp_path: Path) -> None:
    """Its cap decides nothing while its room holds twice the workers no policy gives it: it is
    read every ``roomy_refresh_s``, not every ``refresh_s`` (on a 16-job node those reads were
    a fifth of the controller's CPU)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    meminfo = proc / "meminfo"
    _process(proc, PARENT, 1, rss_mib=300)
    _process(proc, WORKER, PARENT, rss_mib=100)
    for pid in (PARENT, WORKER):
        (proc / str(pid) / "smaps_rollup").write_text(
            "00400000-7fff [rollup]\nPrivate_Clean: 0 kB\nPrivate_Dirty: 102400 kB\nPss_Shmem: 0 kB\n")
    now = [0.0]
    memory = WorkerMemory(reserve_bytes=0, proc=proc, cgroup_root=tmp_path / "cgroup", refresh_s=2.0,
                          roomy_refresh_s=10.0, clock=lambda: now[0])
    view = JobView(job_id="j", name="roomy", requested_workers=3, steady_workers=1, window_batches=4.0)
    pids = {"j": {PARENT, WORKER}}

    def at(seconds: float, available_mib: int) -> int | None:
        now[0] = seconds
        meminfo.write_text(f"MemTotal: {64 << 20} kB\nMemAvailable: {available_mib * 1024} kB\n")
        return memory.annotate([view], pids)[0].max_workers

    assert at(0.0, 16 << 10) > 64  # 16 GiB: room for 64 workers of 100 MiB twice over
    assert at(5.0, 1 << 10) > 64  # the node's memory shrank, but a roomy verdict holds 10 s
    assert at(11.0, 1 << 10) <= 10  # measured again: 1 GiB holds a few workers at most
    assert at(12.0, 16 << 10) <= 10  # a tight verdict holds 2 s only ...
    assert at(13.0, 16 << 10) > 64  # ... and is read again after them
