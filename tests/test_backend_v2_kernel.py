"""The cgroup v2 backend's limits on the real kernel: a quota, a cpuset, CPU weights, a read throttle.

They run where a cgroup2 mount offers the cpu, cpuset and io controllers to its children, as root
(the lent GPU machine, a cgroup v2 VM, where they passed on 2026-11-27); this machine binds those
controllers to cgroup v1, so here they skip saying so. The job groups go under a unique group at
the mount's root and are removed at the end. Rates are bounded loosely: other processes share the
machine, and the test checks that the limit acts, not how precisely.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from controller.backends.base import BackendError
from controller.backends.blockdev import read_device_of
from controller.backends.cgroup_v2 import CgroupV2Backend
from fixtures.processes import BUSY, SLEEP, Children, children, throttled_read_seconds  # noqa: F401

MOUNT = Path("/sys/fs/cgroup")
NEEDED = {"cpu", "cpuset", "io"}


def _offered() -> set[str]:
    try:
        return set((MOUNT / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


pytestmark = pytest.mark.skipif(
    not NEEDED <= _offered() or os.geteuid() != 0,
    reason=f"no cgroup2 mount at {MOUNT} offering cpu, cpuset and io (here they are bound to cgroup v1), or not root",
)


@pytest.fixture
def backend(children: Children) -> Iterator[CgroupV2Backend]:
    backend = CgroupV2Backend(group=f"adloader-test-{uuid.uuid4().hex[:8]}", root=MOUNT)
    yield backend
    children.kill_all()
    for job in backend.existing_jobs():
        backend.remove(job)
    if (MOUNT / backend.group).exists():
        (MOUNT / backend.group).rmdir()


def _cpu_rate(backend: CgroupV2Backend, job: str, seconds: float = 2.0) -> float:
    cpu_before, wall_before = backend.cpu_seconds(job), time.monotonic()
    time.sleep(seconds)
    return (backend.cpu_seconds(job) - cpu_before) / (time.monotonic() - wall_before)


def test_half_a_core_cpu_max_holds_a_busy_process_near_half_a_core(backend: CgroupV2Backend, children: Children) -> None:
    backend.create("job-a")
    backend.set_cpu_quota("job-a", 0.5)
    backend.attach("job-a", children.start(BUSY).pid)
    time.sleep(0.3)
    rate = _cpu_rate(backend, "job-a")
    assert 0.3 <= rate <= 0.7, f"busy process under a 0.5-core cpu.max used {rate:.2f} core-s/s"


def test_the_cpuset_confines_the_jobs_processes_to_its_cpus(backend: CgroupV2Backend, children: Children) -> None:
    backend.create("job-a")
    backend.set_cpuset("job-a", (0,))
    sleeper = children.start(SLEEP)
    backend.attach("job-a", sleeper.pid)
    assert os.sched_getaffinity(sleeper.pid) == {0}
    backend.set_cpuset("job-a", None)
    assert len(os.sched_getaffinity(sleeper.pid)) == len(os.sched_getaffinity(0)), "lifted: the parent's CPUs again"


def test_cpu_weights_split_a_contended_cpu_in_their_ratio(backend: CgroupV2Backend, children: Children) -> None:
    for job, weight in (("light", 100), ("heavy", 300)):
        backend.create(job)
        backend.set_cpuset(job, (0,))
        backend.set_cpu_weight(job, weight)
        backend.attach(job, children.start(BUSY).pid)
    time.sleep(0.3)
    before = {job: backend.cpu_seconds(job) for job in ("light", "heavy")}
    time.sleep(2.0)
    used = {job: backend.cpu_seconds(job) - before[job] for job in before}
    ratio = used["heavy"] / used["light"]
    assert 2.0 <= ratio <= 4.5, f"weights 300:100 on one CPU gave {used['heavy']:.2f}:{used['light']:.2f} CPU-s"


def test_io_max_slows_direct_reads_from_the_disk(backend: CgroupV2Backend, children: Children, tmp_path: Path) -> None:
    """4 MiB read with O_DIRECT at 2 MB/s. Only a lower bound on the time is checked: the throttle
    can only make reads slower, and load on the machine can only add time."""
    try:
        disk = read_device_of(tmp_path)
    except BackendError as exc:
        pytest.skip(f"{tmp_path} is on no block device to throttle: {exc}")
    elapsed = throttled_read_seconds(backend, children, tmp_path, disk)
    assert elapsed >= 1.0, f"4 MiB at 2 MB/s from {disk} took only {elapsed:.2f} s: io.max is not enforced"
