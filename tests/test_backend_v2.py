"""The cgroup v2 backend.

This machine's cgroup2 mount (/sys/fs/cgroup/unified) offers no cpu or io
controller (they are bound to the v1 hierarchies), so the backend is tested
against a fixture tree under tmp_path whose files mimic the kernel's (see
tests/fixtures/cgroup2_tree.py). Where a cgroup2 mount offers cpu, the last test
also runs the backend against the real kernel; here it is skipped with that reason.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from controller.backends.base import BackendError
from controller.backends.cgroup_v2 import CgroupV2Backend
from fixtures.cgroup2_tree import make_cgroup2_tree
from fixtures.processes import SLEEP, Children, children  # noqa: F401

GROUP = "adloader"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_cgroup2_tree(tmp_path / "cgroup", GROUP, ["job-a", "job-b"])


@pytest.fixture
def backend(tree: Path) -> CgroupV2Backend:
    return CgroupV2Backend(group=GROUP, root=tree, proc=tree.parent / "proc")


def test_capabilities_follow_the_controllers_the_root_offers(tmp_path: Path) -> None:
    full = CgroupV2Backend(GROUP, make_cgroup2_tree(tmp_path / "full", GROUP, []))
    assert full.capabilities == {"groups", "cpu_accounting", "cpu_quota", "cpu_weight", "cpuset", "read_bps"}
    bare = CgroupV2Backend(GROUP, make_cgroup2_tree(tmp_path / "bare", GROUP, ["job-a"], controllers="memory pids"))
    assert bare.capabilities == {"groups", "cpu_accounting"}
    with pytest.raises(BackendError, match=r"cpu controller is not offered in .*cgroup\.controllers"):
        bare.set_cpu_quota("job-a", 1.0)
    with pytest.raises(BackendError, match="not a cgroup v2 mount"):
        CgroupV2Backend(GROUP, tmp_path / "empty")


def test_create_enables_the_controllers_once(backend: CgroupV2Backend, tree: Path) -> None:
    assert backend.create("job-a") == str(tree / GROUP / "job-a")
    for directory in (tree, tree / GROUP):
        assert (directory / "cgroup.subtree_control").read_text() == "+cpu +cpuset +io"
        (directory / "cgroup.subtree_control").write_text("cpuset cpu io\n")  # as the kernel shows it
    backend.create("job-a")
    for directory in (tree, tree / GROUP):
        assert (directory / "cgroup.subtree_control").read_text() == "cpuset cpu io\n", "enabled twice"


def test_writes_use_the_kernel_formats(backend: CgroupV2Backend, tree: Path) -> None:
    job = tree / GROUP / "job-a"
    backend.set_cpu_quota("job-a", 1.5)
    assert (job / "cpu.max").read_text() == "150000 100000"
    backend.set_cpu_quota("job-a", None)
    assert (job / "cpu.max").read_text() == "max 100000"
    backend.set_cpuset("job-a", (0, 1, 3))
    assert (job / "cpuset.cpus").read_text() == "0-1,3"
    backend.set_cpuset("job-a", None)
    assert (job / "cpuset.cpus").read_text() == "0-1", "the group's own CPUs: the kernel refuses an empty set to a busy group"
    backend.set_read_bps("job-a", "254:0", 5_000_000)
    assert (job / "io.max").read_text() == "254:0 rbps=5000000"
    backend.set_read_bps("job-a", "254:0", None)
    assert (job / "io.max").read_text() == "254:0 rbps=max"
    backend.attach("job-a", 4242)
    assert (job / "cgroup.procs").read_text() == "4242"


def test_reads_pids_cpu_time_and_existing_jobs(backend: CgroupV2Backend, tree: Path) -> None:
    job = tree / GROUP / "job-a"
    (job / "cgroup.procs").write_text("101\n202\n")
    (job / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert backend.pids("job-a") == {101, 202}
    assert backend.cpu_seconds("job-a") == 2.5
    assert backend.existing_jobs() == ["job-a", "job-b"]
    assert backend.pids("never-created") == set()


def test_a_training_process_detached_on_a_bare_node_goes_to_the_root(backend: CgroupV2Backend, tree: Path) -> None:
    backend.create("job-a")
    backend.attach("job-a", 101)
    backend.detach("job-a", 101)
    assert (tree / "cgroup.procs").read_text() == "101"


def test_release_lifts_every_limit(backend: CgroupV2Backend, tree: Path) -> None:
    job = tree / GROUP / "job-b"
    backend.set_cpu_quota("job-b", 0.5)
    backend.set_cpuset("job-b", (1,))
    (job / "io.max").write_text("254:0 rbps=5000000 wbps=max riops=max wiops=max\n")
    backend.release("job-b")
    assert (job / "cpu.max").read_text() == "max 100000"
    assert (job / "cpuset.cpus").read_text() == "0-1"
    assert (job / "io.max").read_text() == "254:0 rbps=max"


def test_remove_of_an_empty_or_missing_group(backend: CgroupV2Backend, tree: Path) -> None:
    empty = tree / GROUP / "job-c"
    empty.mkdir()  # a kernel group's files vanish with rmdir; an empty directory stands in for one here
    backend.remove("job-c")
    assert not empty.exists()
    backend.remove("job-c")


def test_job_of_reads_the_unified_line_of_proc_cgroup(backend: CgroupV2Backend, tree: Path) -> None:
    proc = tree.parent / "proc"
    for pid, line in {10: f"0::/{GROUP}/job-a", 11: "0::/user.slice", 12: f"3:cpu:/{GROUP}/job-a\n0::/"}.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(line + "\n")
    assert backend.job_of(10) == "job-a"
    assert backend.job_of(11) is None
    assert backend.job_of(12) is None
    assert backend.job_of(99) is None


def test_refuses_bad_values(backend: CgroupV2Backend) -> None:
    with pytest.raises(BackendError, match="not positive"):
        backend.set_cpu_quota("job-a", 0)
    with pytest.raises(BackendError, match="MAJ:MIN"):
        backend.set_read_bps("job-a", "sda", 1)
    with pytest.raises(BackendError, match="cpu.max"):
        backend.set_cpu_quota("never-created", 1.0)


def _kernel_cgroup2_with_cpu() -> Path | None:
    for candidate in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        try:
            if "cpu" in (candidate / "cgroup.controllers").read_text().split():
                return candidate
        except OSError:
            continue
    return None


def test_against_the_kernel_cgroup2_mount(children: Children) -> None:
    root = _kernel_cgroup2_with_cpu()
    if root is None or os.geteuid() != 0:
        pytest.skip(
            "no cgroup2 mount with the cpu controller here (/sys/fs/cgroup/unified offers only hugetlb: "
            "cpu and io are bound to cgroup v1), or not root"
        )
    backend = CgroupV2Backend(group=f"adloader-test-{uuid.uuid4().hex[:8]}", root=root)
    try:
        backend.create("job-a")
        sleeper = children.start(SLEEP)
        backend.attach("job-a", sleeper.pid)
        assert backend.pids("job-a") == {sleeper.pid}
        backend.set_cpu_quota("job-a", 0.5)
        assert (root / backend.group / "job-a" / "cpu.max").read_text().split() == ["50000", "100000"]
        backend.remove("job-a")
        assert sleeper.poll() is None and not (root / backend.group).exists(), "the group goes with its last job"
    finally:
        children.kill_all()
        for job in backend.existing_jobs():
            backend.remove(job)
        if (root / backend.group).exists():
            (root / backend.group).rmdir()
