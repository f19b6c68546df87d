"""Nested placement on cgroup v2, in the layouts kubelet and systemd make.

This machine's cgroup2 mount offers no cpu controller (tests/test_backend_v2.py says
why), so the layouts are fixture trees (tests/fixtures/cgroup2_tree.py) whose files
stand in for the kernel's, and /proc/PID/cgroup is a fixture file too. What is
checked: the job's group is ``<scheduler's cgroup>/<group>/<job>``; v2's
no-internal-process rule is handled (the processes already in the scheduler's
cgroup move to a leaf before it gives controllers to our group, and come back
after); the job's levers are only the controllers its parent offers, and CPU
weights only where every job shares the parent; its CPUs stay inside the
scheduler's cpuset. The last test runs the same steps on the real kernel where a
writable cgroup2 mount offers cpu, and skips saying why elsewhere.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.backends.cgroupfs import PLACEMENT_REFRESH_S, read_pid_list
from controller.policies.base import JobAllocation, NodeResources
from controller.reconciler import reconcile
from fixtures.cgroup2_tree import make_cgroup2_tree, make_group
from fixtures.processes import SLEEP, Children, children  # noqa: F401

GROUP = "adloader"
LAYOUTS = {
    "kubelet-systemd": ("kubernetes", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                                      "cri-containerd-{cid}.scope"),
    "kubelet-cgroupfs": ("kubernetes", "kubepods/burstable/pod{uid}/{cid}"),
    "systemd-service": ("systemd", "system.slice/train-{cid}.service"),
    "systemd-session": ("systemd", "user.slice/user-0.slice/session-{cid}.scope"),
}
LAUNCHER, RESIDENT = 4242, 77


def _layout(root: Path, template: str, job: str, controllers: str = "cpuset cpu io memory pids",
            launcher: int = LAUNCHER) -> Path:
    """The scheduler's cgroup (holding the launcher and another process, e.g. a container's
    shell), the groups the backend will make below it, and the launcher's /proc/PID/cgroup."""
    relative = template.format(uid=uuid.uuid4(), cid=uuid.uuid4().hex[:12])
    parent = make_group(root / relative, controllers, cgroup__procs=f"{launcher}\n{RESIDENT}\n",
                        cpuset__cpus__effective="2-3\n")
    make_group(parent / f"{GROUP}.leaf", controllers)
    make_group(parent / GROUP, controllers)
    make_group(parent / GROUP / job, controllers)
    proc = root.parent / "proc" / str(launcher)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::/{relative}\n")
    return parent


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_cgroup2_tree(tmp_path / "cgroup", GROUP, [])


def _backend(root: Path) -> CgroupV2Backend:
    return CgroupV2Backend(group=GROUP, root=root, proc=root.parent / "proc")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_group_nests_below_the_schedulers_cgroup_whose_processes_move_to_a_leaf(root: Path, layout: str) -> None:
    scheduler, template = LAYOUTS[layout]
    parent = _layout(root, template, "job-a")
    backend = _backend(root)
    job_dir = parent / GROUP / "job-a"
    assert backend.create("job-a", near_pid=LAUNCHER) == str(job_dir)
    assert read_pid_list(parent / f"{GROUP}.leaf" / "cgroup.procs") & {LAUNCHER, RESIDENT}, "residents moved to the leaf"
    for directory in (parent, parent / GROUP):
        assert (directory / "cgroup.subtree_control").read_text() == "+cpu +cpuset +io"
    backend.attach("job-a", LAUNCHER)
    assert read_pid_list(job_dir / "cgroup.procs") == {LAUNCHER}
    backend.detach("job-a", 5151)  # a rank kept apart: beside the scheduler's own processes, not in its cgroup
    assert read_pid_list(parent / f"{GROUP}.leaf" / "cgroup.procs") == {5151}, "(a fixture file keeps the last write)"

    placement = backend.placement("job-a")
    assert placement.scheduler == scheduler
    assert placement.paths == {"unified": "/" + str(job_dir.relative_to(root))}
    assert placement.capabilities == {"groups", "cpu_accounting", "cpu_quota", "cpu_weight", "cpuset", "read_bps"}
    assert placement.allowed_cpus == (2, 3)

    result = reconcile(backend, NodeResources(cpus=(0, 1, 2, 3)), {"job-a": JobAllocation(cores=1.5)}, {})
    assert not result.failures
    assert (job_dir / "cpu.max").read_text() == "150000 100000"
    assert (job_dir / "cpuset.cpus").read_text() == "2-3", "inside the scheduler's CPUs, not all managed ones"

    # rmdir makes a kernel group's files vanish; emptied directories stand in for that here
    for directory in (job_dir, parent / f"{GROUP}.leaf", parent / GROUP):
        for entry in directory.iterdir():
            if entry.is_file():
                entry.unlink()
    backend.remove("job-a")
    assert not (parent / GROUP).exists() and not (parent / f"{GROUP}.leaf").exists()
    assert (parent / "cgroup.subtree_control").read_text() == "-cpu -cpuset -io", "the scheduler's cgroup as it was"
    assert backend.existing_jobs() == []


def test_a_job_gets_only_the_levers_its_parent_offers(root: Path) -> None:
    parent = _layout(root, LAYOUTS["systemd-service"][1], "job-a", controllers="cpu memory pids")
    backend = _backend(root)
    backend.create("job-a", near_pid=LAUNCHER)
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu"
    assert backend.placement("job-a").capabilities == {"groups", "cpu_accounting", "cpu_quota", "cpu_weight"}
    result = reconcile(backend, NodeResources(cpus=(0, 1), read_device="254:0"),
                       {"job-a": JobAllocation(cores=1.0, cpus=(1,), read_bps=1000)}, {})
    assert [c.field for c in result.changes] == ["cores"] and not result.failures


def test_cpu_weights_act_only_where_every_job_shares_the_parent(root: Path) -> None:
    backend = _backend(root)
    first = _layout(root, LAYOUTS["kubelet-systemd"][1], "job-a", launcher=10)
    _layout(root, LAYOUTS["kubelet-systemd"][1], "job-b", launcher=11)
    backend.create("job-a", near_pid=10)
    assert "cpu_weight" in backend.placement("job-a").capabilities, "alone, its weight is among siblings"
    backend.create("job-b", near_pid=11)
    for job in ("job-a", "job-b"):
        assert "cpu_weight" not in backend.placement(job).capabilities
        assert "cpu_quota" in backend.placement(job).capabilities
    make_group(first / GROUP / "job-c")
    (root.parent / "proc" / "12").mkdir()
    (root.parent / "proc" / "12" / "cgroup").write_text(f"0::/{first.relative_to(root)}\n")
    backend.create("job-c", near_pid=12)
    assert backend.placement("job-c").paths["unified"].startswith("/" + str(first.relative_to(root)))


def test_a_pods_cpu_limit_above_its_container_and_the_cpuset_bound_the_cores_a_job_can_use(root: Path) -> None:
    """kubelet sets a pod's CPU limit as ``cpu.max`` on the pod's cgroup (and the container's):
    the tightest on the job's parent or above, or its cpuset's CPUs if fewer, is what the
    policies plan within (JobView.max_cores)."""
    parent = _layout(root, LAYOUTS["kubelet-cgroupfs"][1], "job-a")  # cpuset 2-3
    clock = [0.0]
    backend = CgroupV2Backend(group=GROUP, root=root, proc=root.parent / "proc", clock=lambda: clock[0])
    backend.create("job-a", near_pid=LAUNCHER)
    assert backend.placement("job-a").cpu_limit == 2.0, "no quota: its cpuset's two CPUs"
    (parent.parent / "cpu.max").write_text("150000 100000\n")  # the pod's limit
    clock[0] += PLACEMENT_REFRESH_S
    assert backend.placement("job-a").cpu_limit == 1.5
    (parent / "cpu.max").write_text("50000 100000\n")  # the container's own, tighter
    (parent / GROUP / "cpu.max").write_text("10000 100000\n")  # ours, below the scheduler's: not a limit of its
    clock[0] += PLACEMENT_REFRESH_S
    assert backend.placement("job-a").cpu_limit == 0.5


def test_a_job_whose_parent_offers_no_cpu_leaves_the_others_their_weights(root: Path) -> None:
    """Two jobs in one pod share a parent; a third in a unit whose parent offers only memory and
    pids has no CPU lever at all, so it is no reason to plan the other two by quota."""
    backend = _backend(root)
    pod = _layout(root, LAYOUTS["kubelet-systemd"][1], "job-a", launcher=10)
    make_group(pod / GROUP / "job-b")
    (root.parent / "proc" / "11").mkdir()
    (root.parent / "proc" / "11" / "cgroup").write_text(f"0::/{pod.relative_to(root)}\n")
    _layout(root, LAYOUTS["systemd-service"][1], "job-c", controllers="memory pids", launcher=12)
    for job, pid in (("job-a", 10), ("job-b", 11), ("job-c", 12)):
        backend.create(job, near_pid=pid)
    assert "cpu_weight" in backend.placement("job-a").capabilities
    assert "cpu_weight" in backend.placement("job-b").capabilities
    assert not backend.placement("job-c").capabilities & {"cpu_weight", "cpu_quota"}


def test_a_restarted_controller_finds_nested_groups_again(root: Path) -> None:
    parent = _layout(root, LAYOUTS["kubelet-cgroupfs"][1], "job-a")
    _backend(root).create("job-a", near_pid=LAUNCHER)
    (parent / GROUP / "job-a" / "cgroup.procs").write_text(f"{LAUNCHER}\n")
    restarted = _backend(root)
    assert restarted.existing_jobs() == ["job-a"]
    assert restarted.pids("job-a") == {LAUNCHER}
    assert restarted.create("job-a") == str(parent / GROUP / "job-a")
    assert restarted.placement("job-a").scheduler == "kubernetes"


def _writable_cgroup2_with_cpu() -> Path | None:
    for candidate in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        try:
            if "cpu" in (candidate / "cgroup.controllers").read_text().split() and \
                    os.access(candidate / "cgroup.subtree_control", os.W_OK):
                return candidate
        except OSError:
            continue
    return None


def test_on_the_real_kernel_a_busy_parent_hands_its_processes_to_a_leaf(children: Children) -> None:
    mount = _writable_cgroup2_with_cpu()
    if mount is None or os.geteuid() != 0:
        pytest.skip("no writable cgroup2 mount offering the cpu controller here (/sys/fs/cgroup/unified offers "
                    "only hugetlb: cpu is bound to cgroup v1), or not root")
    top = mount / f"adloader-test-{uuid.uuid4().hex[:8]}-layout"
    parent = top / "system.slice" / "train.service"
    backend = CgroupV2Backend(group=f"adloader-test-{uuid.uuid4().hex[:8]}", root=mount)
    try:
        top.mkdir()
        (mount / "cgroup.subtree_control").write_text("+cpu")
        (top / "cgroup.subtree_control").write_text("+cpu")
        (top / "system.slice").mkdir()
        (top / "system.slice" / "cgroup.subtree_control").write_text("+cpu")
        parent.mkdir()
        launcher, resident = children.start(SLEEP), children.start(SLEEP)
        for process in (launcher, resident):
            (parent / "cgroup.procs").write_text(str(process.pid))
        backend.create("job-a", near_pid=launcher.pid)
        backend.attach("job-a", launcher.pid)
        job_dir = parent / backend.group / "job-a"
        assert read_pid_list(job_dir / "cgroup.procs") == {launcher.pid}
        assert read_pid_list(parent / f"{backend.group}.leaf" / "cgroup.procs") == {resident.pid}
        backend.set_cpu_quota("job-a", 0.5)
        assert (job_dir / "cpu.max").read_text().split() == ["50000", "100000"]
        backend.remove("job-a")
        assert read_pid_list(parent / "cgroup.procs") == {launcher.pid, resident.pid}
        assert not (parent / backend.group).exists() and not (parent / f"{backend.group}.leaf").exists()
    finally:
        children.kill_all()
        for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)) + [top]:
            if directory.exists():
                directory.rmdir()


def test_a_controller_in_a_private_cgroup_namespace_places_jobs_at_their_real_path(root: Path) -> None:
    """A DaemonSet pod on cgroup v2 has its own cgroup namespace (containerd's default): it
    sees another pod's container as ``/../../../../kubepods.slice/...``, relative to its own cgroup."""
    make_group(root / "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podc.slice/"
                                  "cri-containerd-ctl.scope", cgroup__procs=f"{os.getpid()}\n")
    parent = _layout(root, LAYOUTS["kubelet-systemd"][1], "job-a")
    real = "/" + str(parent.relative_to(root))
    (root.parent / "proc" / str(LAUNCHER) / "cgroup").write_text(f"0::/../../../..{real}\n")
    (root.parent / "proc" / str(os.getpid())).mkdir()
    (root.parent / "proc" / str(os.getpid()) / "cgroup").write_text("0::/\n")
    backend = _backend(root)
    assert backend.create("job-a", near_pid=LAUNCHER) == str(parent / GROUP / "job-a")
    assert backend.placement("job-a").scheduler == "kubernetes"


def test_a_second_launcher_from_the_same_cgroup_nests_its_job_beside_the_first(root: Path) -> None:
    """Seen on a real cgroup v2 node: the first job's placement moved the other launchers of the
    same shell into the leaf, and each next job went one leaf deeper, under another parent."""
    parent = _layout(root, LAYOUTS["systemd-service"][1], "job-a", launcher=10)
    make_group(parent / GROUP / "job-b")
    proc = root.parent / "proc" / "11"
    proc.mkdir()
    (proc / "cgroup").write_text(f"0::/{parent.relative_to(root)}/{GROUP}.leaf\n")  # where job-a's placement moved it
    backend = _backend(root)
    backend.create("job-a", near_pid=10)
    assert backend.create("job-b", near_pid=11) == str(parent / GROUP / "job-b")
    assert all("cpu_weight" in backend.placement(job).capabilities for job in ("job-a", "job-b"))


def test_a_cgroup_given_no_cpu_and_owned_by_no_scheduler_sends_the_job_to_the_root(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An agent's cgroup whose parent enables no cpu for it (the lent GPU machine's /process_api/<id>):
    nested there, no limit could act on the job; at the root every one does."""
    make_group(root / "agent", "cpuset cpu io memory pids")  # given cpu, but enables only memory and pids
    parent = make_group(root / "agent" / "session", "memory pids", cgroup__procs=f"{LAUNCHER}\n{RESIDENT}\n")
    make_group(root / GROUP / "job-a")
    proc = root.parent / "proc" / str(LAUNCHER)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/agent/session\n")
    backend = _backend(root)
    with caplog.at_level("INFO", logger="controller.backends.cgroup_v2"):
        assert backend.create("job-a", near_pid=LAUNCHER) == str(root / GROUP / "job-a")
    assert f"given no cpu, cpuset, io (not enabled for its children by {root / 'agent'})" in caplog.text
    assert not (parent / f"{GROUP}.leaf").exists() and read_pid_list(parent / "cgroup.procs") == {LAUNCHER, RESIDENT}
    assert backend.placement("job-a").capabilities >= {"cpu_quota", "cpu_weight", "cpuset", "read_bps"}


def test_under_a_scheduler_a_withheld_controller_is_named_and_nothing_moves_for_it(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_group(root / "system.slice", "cpuset cpu io memory pids")
    parent = _layout(root, "system.slice/train-x.service", "job-a", controllers="memory pids")
    (parent / f"{GROUP}.leaf").rename(root.parent / "unused-leaf")
    backend = _backend(root)
    with caplog.at_level("WARNING", logger="controller.backends.cgroup_v2"):
        assert backend.create("job-a", near_pid=LAUNCHER) == str(parent / GROUP / "job-a")
    assert f"is given no cpu, cpuset, io (not enabled for its children by {root / 'system.slice'})" in caplog.text
    assert "Delegate=yes" in caplog.text
    assert not (parent / f"{GROUP}.leaf").exists(), "no process moves where no controller can be enabled"
    assert backend.placement("job-a").capabilities == {"groups", "cpu_accounting"}


def test_a_cgroup_given_no_cpu_but_bounded_by_a_memory_limit_keeps_the_job(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Moved to the root the job would leave its cgroup's memory.max behind: it stays, and the
    warning says why and what to delegate."""
    make_group(root / "agent", "cpuset cpu io memory pids", memory__max="8589934592\n")
    parent = make_group(root / "agent" / "session", "memory pids", cgroup__procs=f"{LAUNCHER}\n")
    for group in (parent / GROUP, parent / GROUP / "job-a"):
        make_group(group, "memory pids")
    proc = root.parent / "proc" / str(LAUNCHER)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/agent/session\n")
    with caplog.at_level("WARNING", logger="controller.backends.cgroup_v2"):
        assert _backend(root).create("job-a", near_pid=LAUNCHER) == str(parent / GROUP / "job-a")
    assert f"bounded by {root / 'agent' / 'memory.max'}=8589934592" in caplog.text
