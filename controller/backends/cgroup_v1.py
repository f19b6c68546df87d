"""cgroup v1 backend: one group per job in each of the cpu, cpuacct, cpuset and blkio hierarchies.

A job's group is ``<root>/<hierarchy>/<parent>/<group>/<job_id>``, ``<parent>`` the
cgroup the launcher was in (nested placement, see placement.py; ``/`` on a bare node). Values go through
cgroupspy's typed controller files (cpu.cfs_quota_us, cpuacct.usage,
cpuset.cpus/mems, blkio.throttle.read_bps_device). A hierarchy that is not
mounted drops the capability it provides instead of failing the whole backend.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cgroupspy.contenttypes import DeviceThrottle
from cgroupspy.nodes import Node

from controller.backends.base import BackendError, Placement
from controller.backends.cgroupfs import (
    CFS_PERIOD_US,
    RereadEvery,
    check_bps,
    check_name,
    cpu_limit,
    drain_and_rmdir,
    job_from_proc_cgroup,
    kernel_call,
    parse_device,
    quota_us,
    read_cpus,
    read_pid_list,
    remove_if_unused,
    shares_of,
    tightest_quota,
    write_interface,
)
from controller.backends.placement import detect_scheduler, find_job_groups, launcher_cgroups, parent_below, relative

log = logging.getLogger(__name__)

LEFTOVER_WATCH_S = 60.0
"""How long after a removal the scheduler's leftovers are watched for (see tidy())."""
TRACKING_HIERARCHY = "freezer"
"""Where Slurm's proctrack/cgroup (and runc, systemd) track a job's processes on v1."""

_CPU_HIERARCHIES = ("cpu", "cpuacct")
"""Where a training process leaves its job's group (detach): the weight, quota and CPU time."""
_CAPABILITY_OF_HIERARCHY = {
    "cpu": "cpu_quota",
    "cpuacct": "cpu_accounting",
    "cpuset": "cpuset",
    "blkio": "read_bps",
}


class CgroupV1Backend:
    """Enforces CPU quota, cpuset and read throttles through cgroup v1 (needs root)."""

    name = "cgroup-v1"

    def __init__(
        self, group: str = "adloader", root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = check_name(group, "cgroup name")
        self.root = Path(root)
        self._proc = Path(proc)
        self._clock = clock
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
        self._jobs: dict[str, dict[str, Node]] = {}
        """Each placed job's group node per hierarchy. Nodes are only paths, so they are built
        once: every control step reads each job's CPU time, and rebuilding the chain each time
        was most of the controller's CPU."""
        self._found: dict[str, dict[str, Path]] = {}
        """Job groups found by existing_jobs() (left by an earlier controller), not yet placed."""
        self._schedulers: dict[str, str] = {}
        self._placed: dict[str, tuple[bytes, dict[str, str]]] = {}
        """Per job: its cpu group's parent and its groups' paths, computed once (cgroupspy walks the
        tree for each full_path: per job and per step, for every job, that was O(n²) and the
        largest part of the controller's CPU on a 16-job node)."""
        self._tracking: dict[str, Path] = {}
        """Each nested job's cgroup in the scheduler's process-tracking hierarchy (freezer),
        which adloader never manages: when it is gone the scheduler has cleaned up."""
        self._leftovers: list[_Leftover] = []
        """Removed jobs whose scheduler had not finished cleaning up yet (see tidy())."""
        self._scheduler_set = RereadEvery(clock)
        """The cpusets the schedulers gave the jobs' parents."""

    # -- paths -------------------------------------------------------------------------------
    def _node_at(self, hierarchy: str, path: str) -> Node:
        node = Node(hierarchy, parent=Node(str(self.root)))
        for part in path.strip("/").split("/"):
            if part:
                node = Node(part, parent=node)
        return node

    def _job_nodes(self, job_id: str) -> dict[str, Node]:
        """The job's group per hierarchy: where it was placed, where an earlier controller left
        it, or (never created) where a bare node would put it."""
        nodes = self._jobs.get(job_id)
        if nodes is not None:
            return nodes
        found = self._found.get(job_id, {})
        return {
            h: self._node_at(h, relative(found[h], self.root / h) if h in found else f"/{self.group}/{check_name(job_id)}")
            for h in self._hierarchies
        }

    def _paths_of(self, nodes: dict[str, Node]) -> dict[str, str]:
        """Each hierarchy's group path of ``nodes``, relative to that hierarchy's mount."""
        return {h: relative(Path(n.full_path.decode()), self.root / h) for h, n in nodes.items()}

    def _job_node(self, hierarchy: str, job_id: str) -> Node:
        return self._job_nodes(job_id)[hierarchy]

    def _require(self, capability: str, hierarchy: str) -> None:
        if hierarchy not in self._hierarchies:
            raise BackendError(
                f"the {hierarchy} hierarchy is not mounted at {self.root / hierarchy}, so {capability} "
                "cannot be enforced: mount it, or leave that resource unmanaged"
            )

    # -- ResourceBackend ----------------------------------------------------------------------
    def create(self, job_id: str, near_pid: int | None = None) -> str:
        check_name(job_id)
        if job_id not in self._jobs:
            current = launcher_cgroups(near_pid, self._proc, lambda h: self.root / h) if near_pid is not None else {}
            if job_id in self._found:
                nodes = self._job_nodes(job_id)
            else:
                nodes = {
                    h: self._node_at(h, f"{parent_below(current.get(h, '/'), self.group)}/{self.group}/{job_id}")
                    for h in self._hierarchies
                }
            for hierarchy, job_node in nodes.items():
                for node in (job_node.parent, job_node):
                    with kernel_call(node.full_path, f"creating the {hierarchy} group"):
                        # mkdir rather than cgroupspy's create_cgroup, which keeps a list of the
                        # children it made on the (cached) parent node and refuses to repeat one.
                        Path(node.full_path.decode()).mkdir(exist_ok=True)
                        if hierarchy == "cpuset":
                            _inherit_cpuset(node)
                        if hierarchy == "cpu" and node.controller.cfs_period_us != CFS_PERIOD_US:
                            node.controller.cfs_period_us = CFS_PERIOD_US
            self._jobs[job_id] = nodes
            self._placed[job_id] = (nodes["cpu"].parent.full_path, self._paths_of(nodes))
            self._found.pop(job_id, None)
            paths = list(current.values()) + list(self._placed[job_id][1].values())
            self._schedulers[job_id] = detect_scheduler(paths)
            tracking = current.get(TRACKING_HIERARCHY, "/")
            if tracking.strip("/") and TRACKING_HIERARCHY not in self._hierarchies:
                self._tracking[job_id] = self.root / TRACKING_HIERARCHY / tracking.lstrip("/")
        return self._job_node("cpu", job_id).full_path.decode()

    def placement(self, job_id: str) -> Placement:
        nodes = self._job_nodes(job_id)
        capabilities = set(self.capabilities)
        cpu_groups = {parent for parent, _ in self._placed.values()}
        if len(cpu_groups) > 1:
            capabilities.discard("cpu_weight")  # weights act only between siblings: some job has another parent
        allowed = quota = None
        if "cpuset" in nodes:
            scheduler_cpuset = Path(nodes["cpuset"].parent.parent.full_path.decode()) / "cpuset.effective_cpus"
            allowed = self._scheduler_set.get(scheduler_cpuset, lambda: read_cpus(scheduler_cpuset))
        if "cpu" in nodes:
            scheduler_cpu = Path(nodes["cpu"].parent.parent.full_path.decode())
            quota = self._scheduler_set.get(
                (scheduler_cpu, "quota"), lambda: tightest_quota(scheduler_cpu, self.root / "cpu", _quota_cores))
        return Placement(
            scheduler=self._schedulers.get(job_id, "none"),
            paths=dict(self._placed[job_id][1]) if job_id in self._placed else self._paths_of(nodes),
            capabilities=frozenset(capabilities),
            allowed_cpus=allowed,
            cpu_limit=cpu_limit(quota, allowed),
        )

    def attach(self, job_id: str, pid: int) -> None:
        if job_id not in self._jobs:
            raise BackendError(f"job {job_id!r} has no cgroup v1 group: create the job's group first")
        # cgroupspy's ``procs`` setter writes the one pid we give it: the kernel moves the
        # whole process (every thread), and its later children are born inside.
        for hierarchy, node in self._jobs[job_id].items():
            with kernel_call(node.full_path + b"/cgroup.procs", f"moving pid {pid} into the {hierarchy} group"):
                node.controller.procs = [pid]

    def detach(self, job_id: str, pid: int) -> None:
        """Out of the job's cpu and cpuacct groups only: the job's cpuset and read throttles
        still hold the process (v1 keeps one membership per hierarchy)."""
        if job_id not in self._jobs:
            raise BackendError(f"job {job_id!r} has no cgroup v1 group: create the job's group first")
        for hierarchy in _CPU_HIERARCHIES:
            node = self._jobs[job_id].get(hierarchy)
            if node is None:
                continue
            scheduler_node = node.parent.parent
            with kernel_call(scheduler_node.full_path + b"/cgroup.procs",
                             f"moving pid {pid} out of the job's {hierarchy} group"):
                scheduler_node.controller.procs = [pid]

    def pids(self, job_id: str) -> set[int]:
        # Read directly rather than through cgroupspy: a group that is gone reads as "no pids".
        return read_pid_list(Path(self._job_node("cpu", job_id).full_path.decode()) / "cgroup.procs")

    def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
        node = self._job_node("cpu", job_id)
        with kernel_call(node.full_path + b"/cpu.cfs_quota_us", "setting the CPU quota"):
            node.controller.cfs_quota_us = None if cores is None else quota_us(cores)  # None writes -1

    def set_cpu_weight(self, job_id: str, weight: int | None) -> None:
        self._require("cpu_weight", "cpu")
        node = self._job_node("cpu", job_id)
        with kernel_call(node.full_path + b"/cpu.shares", "setting the CPU weight"):
            node.controller.shares = shares_of(weight)
    def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
        self._require("cpuset", "cpuset")
        node = self._job_node("cpuset", job_id)
        with kernel_call(node.full_path + b"/cpuset.cpus", "setting the job's CPUs"):
            wanted = node.parent.controller.cpus if cpus is None else set(cpus)
            if not wanted:
                raise BackendError(f"empty CPU set for job {job_id}: a job must keep at least one CPU")
            node.controller.cpus = wanted

    def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
        self._require("read_bps", "blkio")
        major, minor = parse_device(device)
        node = self._job_node("blkio", job_id)
        limit = 0 if bps is None else check_bps(bps)  # 0 removes the device's throttle
        with kernel_call(node.full_path + b"/blkio.throttle.read_bps_device", f"throttling reads from {device}"):
            node.controller.throttle_read_bps_device = DeviceThrottle(limit, major, minor)

    def cpu_seconds(self, job_id: str) -> float:
        self._require("cpu_accounting", "cpuacct")
        node = self._job_node("cpuacct", job_id)
        with kernel_call(node.full_path + b"/cpuacct.usage", "reading the job's CPU time"):
            return node.controller.usage / 1e9

    def existing_jobs(self) -> list[str]:
        """Job groups anywhere in the managed hierarchies (nested placement puts them below
        the schedulers' cgroups), found by one walk of each; also those placed by this controller."""
        for hierarchy in self._hierarchies:
            for job_id, job_dir in find_job_groups(self.root / hierarchy, self.group).items():
                if job_id not in self._jobs:
                    self._found.setdefault(job_id, {})[hierarchy] = job_dir
        return sorted(set(self._jobs) | set(self._found))

    def remove(self, job_id: str) -> None:
        """Move live pids back to the scheduler's cgroup the job came from, remove the job's
        group, and its parent group when no other job is left there (so that the scheduler
        can remove its own cgroups when its job ends)."""
        nodes = self._job_nodes(job_id)
        try:
            for hierarchy, job_node in nodes.items():
                procs_file = Path(job_node.full_path.decode()) / "cgroup.procs"
                scheduler_node = job_node.parent.parent

                def move_back(pid: int, target: Node = scheduler_node) -> None:
                    with kernel_call(target.full_path + b"/cgroup.procs", f"moving pid {pid} out of the job's group"):
                        target.controller.procs = [pid]

                drain_and_rmdir(Path(job_node.full_path.decode()), lambda: read_pid_list(procs_file), move_back)
                remove_if_unused(Path(job_node.parent.full_path.decode()))
            tracking = self._tracking.get(job_id)
            if tracking is not None:
                self._leftovers.append(_Leftover(
                    tracking, tuple(Path(n.full_path.decode()).parent.parent for n in nodes.values()),
                    self._clock() + LEFTOVER_WATCH_S,
                ))
                self.tidy()
        finally:
            self._tracking.pop(job_id, None)
            self._jobs.pop(job_id, None)
            self._found.pop(job_id, None)
            self._schedulers.pop(job_id, None)
            self._placed.pop(job_id, None)

    def tidy(self) -> None:
        """Remove the scheduler's empty cgroups that our group kept it from removing.

        Slurm removes a job's cgroups once, right after its processes end; in the
        hierarchies where our group was still nested below them then, its rmdir failed
        and they would stay behind, empty, forever (seen with the real slurmd, see
        tests/test_slurm.py). Once the job's cgroup in the tracking hierarchy (freezer,
        never ours) is gone, i.e. the scheduler has finished cleaning up, the ancestors
        of our removed group go, from ours upwards, while empty, gone from the tracking
        hierarchy too, and still the job's own (``.../job_N/...``: a user's directory
        may be about to hold the user's next job). rmdir refuses a cgroup with processes
        or children, so nothing in use can go. Called after each removal and each period;
        a scheduler that has not cleaned up within LEFTOVER_WATCH_S will succeed by itself."""
        now = self._clock()
        pending = []
        for leftover in self._leftovers:
            if leftover.tracking.exists():
                if now < leftover.until:
                    pending.append(leftover)
                continue
            tracking_root = self.root / TRACKING_HIERARCHY
            for directory in leftover.parents:
                mount = self.root / directory.relative_to(self.root).parts[0]
                while _within_a_job(directory.relative_to(mount)) and \
                        not (tracking_root / directory.relative_to(mount)).exists():
                    try:
                        os.rmdir(directory)
                    except OSError:
                        break
                    log.info("removed %s: the scheduler left it behind, empty, because of our group", directory)
                    directory = directory.parent
        self._leftovers = pending

    def remove_group(self) -> None:
        """The bare node's group (nested groups go with their last job, in remove())."""
        for hierarchy in self._hierarchies:
            group_dir = self.root / hierarchy / self.group
            root_procs = self.root / hierarchy / "cgroup.procs"
            drain_and_rmdir(group_dir, lambda d=group_dir: read_pid_list(d / "cgroup.procs"),
                            lambda pid, h=hierarchy, r=root_procs: write_interface(r, str(pid), f"moving pid {pid} "
                                                                                f"out of the {h} group"))

    def release(self, job_id: str) -> None:
        if "cpu" in self._hierarchies:
            self.set_cpu_quota(job_id, None)
            self.set_cpu_weight(job_id, None)
        if "cpuset" in self._hierarchies:
            self.set_cpuset(job_id, None)
        if "blkio" in self._hierarchies:
            node = self._job_node("blkio", job_id)
            with kernel_call(node.full_path + b"/blkio.throttle.read_bps_device", "lifting the read throttles"):
                for throttle in node.controller.throttle_read_bps_device:
                    node.controller.throttle_read_bps_device = DeviceThrottle(0, throttle.major, throttle.minor)

    # -- extras -------------------------------------------------------------------------------
    def job_of(self, pid: int) -> str | None:
        """The job whose group holds ``pid`` (from /proc/PID/cgroup's cpu line), or None."""
        return job_from_proc_cgroup(self._proc, pid, self.group, "cpu")


@dataclass(frozen=True)
class _Leftover:
    tracking: Path
    """The job's cgroup in the tracking hierarchy: gone once the scheduler has cleaned up."""
    parents: tuple[Path, ...]
    """The scheduler's cgroups our removed group was nested in, one per managed hierarchy."""
    until: float
    """Clock time after which the scheduler is left to clean up by itself."""


def _quota_cores(directory: Path) -> float | None:
    """The CFS quota set on a v1 cpu group, in cores; None where unlimited (-1) or unreadable."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _within_a_job(relative_path: Path) -> bool:
    """True for a scheduler's cgroup of one job or below it (Slurm's ``job_N``)."""
    return any(part.startswith("job_") and part[4:].isdigit() for part in relative_path.parts)


def _inherit_cpuset(node: Node) -> None:
    """A new v1 cpuset group starts with no CPUs and no memory nodes, and then refuses every
    process (ENOSPC): give it its parent's, as the kernel would with cgroup.clone_children."""
    controller, parent = node.controller, node.parent.controller
    if not controller.mems:
        controller.mems = parent.mems
    if not controller.cpus:
        controller.cpus = parent.cpus
