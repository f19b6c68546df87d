"""The cgroup v1 backend against the real kernel: a unique group under each hierarchy, removed at the end."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

import pytest

from controller.backends.base import BackendError
from controller.backends.blockdev import read_device_of
from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.backends.cgroupfs import drain_and_rmdir, group_gone, read_pid_list, write_interface
from fixtures.cgroup_v1 import HIERARCHIES, ROOT, needs_v1, remove_group, unique_group
from fixtures.processes import (  # noqa: F401
    BUSY, FORK_ON_GO, SLEEP, Children, children, fork_after_go, throttled_read_seconds,
)

DISK = "254:0"

pytestmark = needs_v1


@pytest.fixture
def backend(children: Children) -> Iterator[CgroupV1Backend]:
    group = unique_group()
    yield CgroupV1Backend(group=group, root=ROOT)
    children.kill_all()
    remove_group(group)


def _read(backend: CgroupV1Backend, hierarchy: str, job: str | None, name: str) -> str:
    directory = ROOT / hierarchy / backend.group
    return ((directory / job if job else directory) / name).read_text().strip()


def test_create_makes_a_usable_group_in_every_hierarchy_and_is_idempotent(backend: CgroupV1Backend) -> None:
    assert backend.capabilities == {"groups", "cpu_quota", "cpu_weight", "cpu_accounting", "cpuset", "read_bps"}
    path = backend.create("job-a")
    assert backend.create("job-a") == path == str(ROOT / "cpu" / backend.group / "job-a")
    for hierarchy in HIERARCHIES:
        assert (ROOT / hierarchy / backend.group / "job-a").is_dir()
    # cpuset groups start empty and would refuse every process: both levels got the root's values.
    for job in (None, "job-a"):
        assert _read(backend, "cpuset", job, "cpuset.cpus") == (ROOT / "cpuset/cpuset.cpus").read_text().strip()
        assert _read(backend, "cpuset", job, "cpuset.mems") == (ROOT / "cpuset/cpuset.mems").read_text().strip()
    assert _read(backend, "cpu", "job-a", "cpu.cfs_period_us") == "100000"
    backend.create("job-b")
    assert backend.existing_jobs() == ["job-a", "job-b"]


def test_attach_puts_the_process_and_its_later_children_in_every_hierarchy(
    backend: CgroupV1Backend, children: Children
) -> None:
    backend.create("job-a")
    parent = children.start(FORK_ON_GO)
    backend.attach("job-a", parent.pid)
    child = fork_after_go(parent)
    assert backend.pids("job-a") == {parent.pid, child}
    lines = Path(f"/proc/{child}/cgroup").read_text().splitlines()
    for hierarchy in HIERARCHIES:
        assert any(line.split(":")[1] == hierarchy and line.endswith(f"/{backend.group}/job-a") for line in lines)
    assert backend.job_of(child) == "job-a"
    assert backend.job_of(os.getpid()) is None


def test_limits_read_back_from_the_kernel_files(backend: CgroupV1Backend) -> None:
    backend.create("job-a")
    backend.set_cpu_quota("job-a", 0.5)
    assert _read(backend, "cpu", "job-a", "cpu.cfs_quota_us") == "50000"
    backend.set_cpu_quota("job-a", None)
    assert _read(backend, "cpu", "job-a", "cpu.cfs_quota_us") == "-1"

    backend.set_cpuset("job-a", (0,))
    assert _read(backend, "cpuset", "job-a", "cpuset.cpus") == "0"
    backend.set_cpuset("job-a", None)
    assert _read(backend, "cpuset", "job-a", "cpuset.cpus") == _read(backend, "cpuset", None, "cpuset.cpus")

    backend.set_read_bps("job-a", DISK, 5_000_000)
    assert _read(backend, "blkio", "job-a", "blkio.throttle.read_bps_device") == f"{DISK} 5000000"
    backend.set_read_bps("job-a", DISK, None)
    assert _read(backend, "blkio", "job-a", "blkio.throttle.read_bps_device") == ""


def test_release_lifts_every_limit_but_keeps_the_group(backend: CgroupV1Backend, children: Children) -> None:
    backend.create("job-a")
    sleeper = children.start(SLEEP)
    backend.attach("job-a", sleeper.pid)
    backend.set_cpu_quota("job-a", 0.25)
    backend.set_cpuset("job-a", (1,))
    backend.set_read_bps("job-a", DISK, 1_000_000)
    backend.release("job-a")
    assert _read(backend, "cpu", "job-a", "cpu.cfs_quota_us") == "-1"
    assert _read(backend, "cpuset", "job-a", "cpuset.cpus") == _read(backend, "cpuset", None, "cpuset.cpus")
    assert _read(backend, "blkio", "job-a", "blkio.throttle.read_bps_device") == ""
    assert backend.pids("job-a") == {sleeper.pid}


def test_a_group_removed_under_a_reader_reads_as_gone(backend: CgroupV1Backend) -> None:
    """The kernel answers a read of a removed group's file with ENODEV when the file was opened
    before the rmdir (a job departing while its limits are read), ENOENT after: both are the
    group gone, and its pid list is empty (the reliability checker once failed on the first)."""
    backend.create("job-a")
    procs = ROOT / "cpu" / backend.group / "job-a" / "cgroup.procs"
    with procs.open() as opened:
        backend.remove("job-a")
        with pytest.raises(OSError) as removed_while_open:
            opened.read()
    with pytest.raises(OSError) as removed:
        procs.read_text()
    assert group_gone(removed_while_open.value) and group_gone(removed.value)
    assert not group_gone(PermissionError(13, "Permission denied"))
    assert read_pid_list(procs) == set()


def test_remove_moves_live_pids_back_where_they_came_from_and_is_idempotent(
    backend: CgroupV1Backend, children: Children
) -> None:
    backend.create("job-a")
    sleeper = children.start(SLEEP)
    backend.attach("job-a", sleeper.pid)
    backend.remove("job-a")
    for hierarchy in HIERARCHIES:
        assert not (ROOT / hierarchy / backend.group).exists(), "the last job's removal removes the group too"
        assert sleeper.pid in read_pid_list(ROOT / hierarchy / "cgroup.procs")
    assert sleeper.poll() is None, "removing the group must not kill the job"
    backend.remove("job-a")
    assert backend.existing_jobs() == []
    assert backend.pids("job-a") == set()


def test_errors_name_the_file_and_the_remedy(backend: CgroupV1Backend, children: Children) -> None:
    with pytest.raises(BackendError, match="create the job's group first"):
        backend.attach("never-created", os.getpid())
    backend.create("job-a")
    exited = children.start("pass")
    exited.wait()
    with pytest.raises(BackendError, match=r"cgroup\.procs.*already exited"):
        backend.attach("job-a", exited.pid)
    with pytest.raises(BackendError, match="at least one CPU"):
        backend.set_cpuset("job-a", ())
    with pytest.raises(BackendError, match="MAJ:MIN"):
        backend.set_read_bps("job-a", "vda", 1)
    with pytest.raises(BackendError, match="cannot name a cgroup"):
        backend.create("../escape")


def test_half_a_core_quota_holds_a_busy_process_near_half_a_core(backend: CgroupV1Backend, children: Children) -> None:
    backend.create("job-a")
    # Other test runs share this 2-core machine: a high cpu.shares keeps them from starving our
    # busy loop, so the measured rate shows the quota and not the contention.
    for job in (None, "job-a"):
        write_interface(ROOT / "cpu" / backend.group / (job or "") / "cpu.shares", "262144", "test setup")
    backend.set_cpu_quota("job-a", 0.5)
    busy = children.start(BUSY)
    backend.attach("job-a", busy.pid)
    time.sleep(0.3)
    cpu_before, wall_before = backend.cpu_seconds("job-a"), time.monotonic()
    time.sleep(2.0)
    rate = (backend.cpu_seconds("job-a") - cpu_before) / (time.monotonic() - wall_before)
    assert 0.3 <= rate <= 0.7, f"busy process under a 0.5-core quota used {rate:.2f} core-s/s"


def test_read_throttle_slows_direct_reads_from_the_disk(
    backend: CgroupV1Backend, children: Children, tmp_path: Path
) -> None:
    """4 MiB read with O_DIRECT at 2 MB/s. Only a lower bound on the time is checked: the throttle
    can only make reads slower, and load on the machine can only add time, so it cannot flake."""
    if read_device_of(tmp_path) != DISK:
        pytest.skip(f"{tmp_path} is not on {DISK}, the disk this test throttles")
    elapsed = throttled_read_seconds(backend, children, tmp_path, DISK)
    assert elapsed >= 1.0, f"4 MiB at 2 MB/s took only {elapsed:.2f} s: the throttle is not enforced"


def test_a_group_still_busy_is_retried_with_a_growing_wait_then_reported() -> None:
    """rmdir of a mount point answers EBUSY as a group with a process still exiting does:
    the drain retries with waits doubling up to half a second, then says what failed."""
    waits: list[float] = []
    with pytest.raises(BackendError, match="removing the job's group failed at /proc"):
        drain_and_rmdir(Path("/proc"), set, lambda pid: None, sleep=waits.append)
    assert waits == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5]
