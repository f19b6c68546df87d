"""cgroup v1 backend: one group per job in each of the cpu, cpuacct, cpuset and blkio hierarchies.

A job's group is ``<root>/<hierarchy>/<group>/<job_id>``. Values go through
cgroupspy's typed controller files (cpu.cfs_quota_us, cpuacct.usage,
cpuset.cpus/mems, blkio.throttle.read_bps_device). A hierarchy that is not
mounted drops the capability it provides instead of failing the whole backend.
"""
from __future__ import annotations

from pathlib import Path

from cgroupspy.contenttypes import DeviceThrottle
from cgroupspy.nodes import Node

from controller.backends.base import BackendError
from controller.backends.cgroupfs import (
    CFS_PERIOD_US,
    check_bps,
    check_name,
    drain_and_rmdir,
    job_from_proc_cgroup,
    kernel_call,
    parse_device,
    quota_us,
    read_pid_list,
    shares_of,
)

_CAPABILITY_OF_HIERARCHY = {
    "cpu": "cpu_quota",
    "cpuacct": "cpu_accounting",
    "cpuset": "cpuset",
    "blkio": "read_bps",
}


class CgroupV1Backend:
    """Enforces CPU quota, cpuset and read throttles through cgroup v1 (needs root)."""

    name = "cgroup-v1"

    def __init__(self, group: str = "adloader", root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> None:
        self.group = check_name(group, "cgroup name")
        self.root = Path(root)
        self._proc = Path(proc)
        self._nodes: dict[tuple[str, str | None], Node] = {}
        if not (self.root / "cpu").is_dir():
            raise BackendError(
                f"no cgroup v1 cpu hierarchy at {self.root / 'cpu'}: mount it "
                "(mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu), or use --backend cgroup-v2 / affinity"
            )
        self._hierarchies = tuple(h for h in _CAPABILITY_OF_HIERARCHY if (self.root / h).is_dir())
        self.capabilities = frozenset(
            {"groups"} | {_CAPABILITY_OF_HIERARCHY[h] for h in self._hierarchies}
            | ({"cpu_weight"} if "cpu" in self._hierarchies else set())
        )

    # -- paths -------------------------------------------------------------------------------
    def _node(self, hierarchy: str, job_id: str | None = None) -> Node:
        """The cgroupspy node of the group (or of the job's group when ``job_id`` is given).
        Nodes are only paths, so they are built once: every control step reads each job's
        CPU time, and rebuilding the chain each time was most of the controller's CPU."""
        key = (hierarchy, job_id)
        node = self._nodes.get(key)
        if node is None:
            if job_id is None:
                node = Node(self.group, parent=Node(hierarchy, parent=Node(str(self.root))))
            else:
                node = Node(check_name(job_id), parent=self._node(hierarchy))
            self._nodes[key] = node
        return node

    def _dir(self, hierarchy: str, job_id: str | None = None) -> Path:
        return Path(self._node(hierarchy, job_id).full_path.decode())

    def _require(self, capability: str, hierarchy: str) -> None:
        if hierarchy not in self._hierarchies:
            raise BackendError(
                f"the {hierarchy} hierarchy is not mounted at {self.root / hierarchy}, so {capability} "
                "cannot be enforced: mount it, or leave that resource unmanaged"
            )

    # -- ResourceBackend ----------------------------------------------------------------------
    def create(self, job_id: str) -> str:
        check_name(job_id)
        for hierarchy in self._hierarchies:
            parent = self._node(hierarchy)
            for node in (parent, self._node(hierarchy, job_id)):
                with kernel_call(node.full_path, f"creating the {hierarchy} group"):
                    # mkdir rather than cgroupspy's create_cgroup, which keeps a list of the
                    # children it made on the (cached) parent node and refuses to repeat one.
                    Path(node.full_path.decode()).mkdir(exist_ok=True)
                    if hierarchy == "cpuset":
                        _inherit_cpuset(node)
                    if hierarchy == "cpu" and node.controller.cfs_period_us != CFS_PERIOD_US:
                        node.controller.cfs_period_us = CFS_PERIOD_US
        return str(self._dir("cpu", job_id))

    def attach(self, job_id: str, pid: int) -> None:
        # cgroupspy's ``procs`` setter writes the one pid we give it: the kernel moves the
        # whole process (every thread), and its later children are born inside.
        for hierarchy in self._hierarchies:
            node = self._node(hierarchy, job_id)
            with kernel_call(node.full_path + b"/cgroup.procs", f"moving pid {pid} into the {hierarchy} group"):
                node.controller.procs = [pid]

    def pids(self, job_id: str) -> set[int]:
        # Read directly rather than through cgroupspy: a group that is gone reads as "no pids".
        return read_pid_list(self._dir("cpu", job_id) / "cgroup.procs")

    def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
        node = self._node("cpu", job_id)
        with kernel_call(node.full_path + b"/cpu.cfs_quota_us", "setting the CPU quota"):
            node.controller.cfs_quota_us = None if cores is None else quota_us(cores)  # None writes -1

    def set_cpu_weight(self, job_id: str, weight: int | None) -> None:
        self._require("cpu_weight", "cpu")
        node = self._node("cpu", job_id)
        with kernel_call(node.full_path + b"/cpu.shares", "setting the CPU weight"):
            node.controller.shares = shares_of(weight)

    def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
        self._require("cpuset", "cpuset")
        node = self._node("cpuset", job_id)
        with kernel_call(node.full_path + b"/cpuset.cpus", "setting the job's CPUs"):
            wanted = node.parent.controller.cpus if cpus is None else set(cpus)
            if not wanted:
                raise BackendError(f"empty CPU set for job {job_id}: a job must keep at least one CPU")
            node.controller.cpus = wanted

    def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
        self._require("read_bps", "blkio")
        major, minor = parse_device(device)
        node = self._node("blkio", job_id)
        limit = 0 if bps is None else check_bps(bps)  # 0 removes the device's throttle
        with kernel_call(node.full_path + b"/blkio.throttle.read_bps_device", f"throttling reads from {device}"):
            node.controller.throttle_read_bps_device = DeviceThrottle(limit, major, minor)

    def cpu_seconds(self, job_id: str) -> float:
        self._require("cpu_accounting", "cpuacct")
        node = self._node("cpuacct", job_id)
        with kernel_call(node.full_path + b"/cpuacct.usage", "reading the job's CPU time"):
            return node.controller.usage / 1e9

    def existing_jobs(self) -> list[str]:
        group_dir = self._dir("cpu")
        if not group_dir.is_dir():
            return []
        return sorted(entry.name for entry in group_dir.iterdir() if entry.is_dir())

    def remove(self, job_id: str) -> None:
        for hierarchy in self._hierarchies:
            job_node = self._node(hierarchy, job_id)
            procs_file = Path(job_node.full_path.decode()) / "cgroup.procs"

            def move_to_parent(pid: int, parent: Node = job_node.parent) -> None:
                with kernel_call(parent.full_path + b"/cgroup.procs", f"moving pid {pid} out of the job's group"):
                    parent.controller.procs = [pid]

            try:
                drain_and_rmdir(Path(job_node.full_path.decode()), lambda: read_pid_list(procs_file), move_to_parent)
            finally:
                self._nodes.pop((hierarchy, job_id), None)

    def release(self, job_id: str) -> None:
        if "cpu" in self._hierarchies:
            self.set_cpu_quota(job_id, None)
            self.set_cpu_weight(job_id, None)
        if "cpuset" in self._hierarchies:
            self.set_cpuset(job_id, None)
        if "blkio" in self._hierarchies:
            node = self._node("blkio", job_id)
            with kernel_call(node.full_path + b"/blkio.throttle.read_bps_device", "lifting the read throttles"):
                for throttle in node.controller.throttle_read_bps_device:
                    node.controller.throttle_read_bps_device = DeviceThrottle(0, throttle.major, throttle.minor)

    # -- extras -------------------------------------------------------------------------------
    def job_of(self, pid: int) -> str | None:
        """The job whose group holds ``pid`` (from /proc/PID/cgroup's cpu line), or None."""
        return job_from_proc_cgroup(self._proc, pid, self.group, lambda ctrls: "cpu" in ctrls.split(","))


def _inherit_cpuset(node: Node) -> None:
    """A new v1 cpuset group starts with no CPUs and no memory nodes, and then refuses every
    process (ENOSPC): give it its parent's, as the kernel would with cgroup.clone_children."""
    controller, parent = node.controller, node.parent.controller
    if not controller.mems:
        controller.mems = parent.mems
    if not controller.cpus:
        controller.cpus = parent.cpus
