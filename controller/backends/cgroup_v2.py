"""cgroup v2 backend: one group per job at ``<root>/<parent>/<group>/<job_id>`` in the unified hierarchy.

``<parent>`` is the cgroup the launcher was in (nested placement, see placement.py;
the root on a bare node, and where that cgroup is given none of some controller the
root offers, no scheduler owns it and no limit bounds it: ``_parent_for``). v2 lets a
non-root cgroup that holds processes give no controller to its children, so the
processes already in ``<parent>`` move to a leaf ``<parent>/<group>.leaf`` first (and
back when the last job there is gone).

Direct writes of the kernel's interface files: cpu.max, cpuset.cpus, io.max,
cgroup.procs, and cpu.stat for accounting. The cpu, cpuset and io controllers are
enabled for the subtree in cgroup.subtree_control of the root and of the group.
Only the controllers the root offers (cgroup.controllers) become capabilities.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from controller.backends.base import BackendError, Placement
from controller.backends.cgroupfs import (
    CFS_PERIOD_US,
    RereadEvery,
    check_bps,
    check_name,
    check_weight,
    cpu_limit,
    drain_and_rmdir,
    job_from_proc_cgroup,
    kernel_call,
    parse_device,
    quota_us,
    read_cpus,
    read_interface,
    read_pid_list,
    remove_if_unused,
    tightest_quota,
    write_interface,
)
from controller.backends.placement import (
    UNIFIED,
    detect_scheduler,
    find_job_groups,
    launcher_cgroups,
    parent_below,
    relative,
)
from adloader.cpuspec import format_cpus

_CAPABILITY_OF_CONTROLLER = {"cpu": "cpu_quota", "cpuset": "cpuset", "io": "read_bps"}

log = logging.getLogger(__name__)


class CgroupV2Backend:
    """Enforces CPU quota, cpuset and read throttles through the unified hierarchy (needs root or delegation)."""

    name = "cgroup-v2"

    def __init__(
        self, group: str = "adloader", root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = check_name(group, "cgroup name")
        self.root = Path(root)
        self._proc = Path(proc)
        self._scheduler_set = RereadEvery(clock)
        """What the schedulers set on the jobs' parents: the controllers offered, the cpuset."""
        if not (self.root / "cgroup.controllers").is_file():
            raise BackendError(
                f"{self.root} is not a cgroup v2 mount (no cgroup.controllers there): pass the unified "
                "hierarchy's mount point (see `mount -t cgroup2`), or use --backend cgroup-v1 / affinity"
            )
        offered = _controllers(self.root / "cgroup.controllers")
        self._controllers = tuple(c for c in _CAPABILITY_OF_CONTROLLER if c in offered)
        self.capabilities = _capabilities_of(self._controllers)
        self._jobs: dict[str, Path] = {}
        """Each placed job's group directory."""
        self._found: dict[str, Path] = {}
        """Job groups found by existing_jobs() (left by an earlier controller), not yet placed."""
        self._schedulers: dict[str, str] = {}

    def _job_dir(self, job_id: str) -> Path:
        """Where the job was placed, where an earlier controller left it, or (never created)
        where a bare node would put it."""
        placed = self._jobs.get(job_id) or self._found.get(job_id)
        return placed if placed is not None else self.root / self.group / check_name(job_id)

    def _leaf(self, parent: Path) -> Path:
        """Where the processes already in ``parent`` go so that it may enable controllers for
        its children (v2's no-internal-process rule)."""
        return parent / f"{self.group}.leaf"

    def _home(self, job_dir: Path) -> Path:
        """Where processes leaving the job's group go: the parent it is nested below when that
        is the root, else the leaf that parent keeps its own processes in."""
        parent = job_dir.parent.parent
        return parent if parent == self.root else self._leaf(parent)

    def _require(self, capability: str, controller: str) -> None:
        if controller not in self._controllers:
            raise BackendError(
                f"the {controller} controller is not offered in {self.root / 'cgroup.controllers'}, so "
                f"{capability} cannot be enforced: enable it in the parent's cgroup.subtree_control "
                "(or boot without cgroup_no_v1 / systemd legacy mode binding it to v1)"
            )

    def _enable_subtree(self, directory: Path) -> None:
        """Write "+cpu +cpuset +io" (those ``directory`` offers and has not enabled yet) to its
        cgroup.subtree_control."""
        missing = self._to_enable(directory)
        if missing:
            write_interface(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing),
                            "enabling controllers for the subtree")

    def _to_enable(self, directory: Path) -> list[str]:
        """Our controllers ``directory`` offers and has not enabled for its children yet."""
        offered = _controllers(directory / "cgroup.controllers")
        enabled = _controllers(directory / "cgroup.subtree_control")
        return [c for c in self._controllers if c in offered and c not in enabled]

    def _parent_for(self, job_id: str, launcher_parent: Path, scheduler: str) -> Path:
        """Where the job's group nests: the launcher's cgroup, unless that cgroup is given none of
        some controller the root offers (an ancestor does not enable it for its children), so no
        limit of that kind could act on the job there. Where no scheduler owns that cgroup (an
        agent's or a runtime's group; seen on a real cgroup v2 node, the lent GPU machine, where
        every job went unlimited) and no limit set on it or above it would be left behind
        (memory.max, memory.high, pids.max), the job goes to the root, as on a bare node, and that
        is logged. Otherwise it stays, as those limits must keep bounding it (a scheduler's
        above all), and a warning says which cgroup withholds what and how to delegate it."""
        if launcher_parent == self.root:
            return launcher_parent
        lacking = [c for c in self._controllers if c not in _offered(launcher_parent)]
        if not lacking:
            return launcher_parent
        by_withholder: dict[Path, list[str]] = {}
        for controller in lacking:
            by_withholder.setdefault(_withholder(self.root, launcher_parent, controller), []).append(controller)
        withheld = "; ".join(f"{', '.join(controllers)} (not enabled for its children by {withholder})"
                             for withholder, controllers in by_withholder.items())
        kept = _limits_above(self.root, launcher_parent)
        if scheduler == "none" and not kept:
            log.info("job %s: its cgroup %s is given no %s, and no scheduler owns it nor any limit bounds it: its "
                     "group goes to %s, where they act", job_id, launcher_parent, withheld, self.root / self.group)
            return self.root
        owner = f"{scheduler} cgroup" if scheduler != "none" else f"cgroup (bounded by {', '.join(kept)})"
        log.warning("job %s: its %s %s is given no %s: those limits cannot act on it. Delegate them: "
                    "echo +CONTROLLER into each cgroup.subtree_control from the one named down to it (a systemd "
                    "unit: Delegate=yes)", job_id, owner, launcher_parent, withheld)
        return launcher_parent

    def _delegate(self, parent: Path) -> None:
        """Let ``parent`` (the scheduler's cgroup the job was started in) give controllers to
        our group: a non-root cgroup holding processes cannot, so they move to a leaf first
        (only where there is a controller to enable: no process is moved for nothing)."""
        if parent != self.root and self._to_enable(parent):
            residents = read_pid_list(parent / "cgroup.procs")
            if residents:
                leaf = self._leaf(parent)
                with kernel_call(leaf, "creating a leaf for the processes already in the job's cgroup"):
                    leaf.mkdir(exist_ok=True)
                for pid in residents:
                    _move(leaf, pid)
        self._enable_subtree(parent)

    def _undelegate(self, parent: Path) -> None:
        """Undo _delegate once our group under ``parent`` is gone: controllers off again and the
        leaf's processes back in ``parent``, so the scheduler finds its cgroup as it made it.
        Only where we made the leaf and nothing else lives below ``parent``."""
        leaf = self._leaf(parent)
        if parent == self.root or not leaf.is_dir():
            return
        if any(entry.is_dir() and entry != leaf for entry in parent.iterdir()):
            return
        control = parent / "cgroup.subtree_control"
        enabled = _controllers(control)
        if enabled:
            write_interface(control, " ".join(f"-{c}" for c in sorted(enabled)), "disabling the controllers we enabled")
        drain_and_rmdir(leaf, lambda: read_pid_list(leaf / "cgroup.procs"), lambda pid: _move(parent, pid))

    # -- ResourceBackend ----------------------------------------------------------------------
    def create(self, job_id: str, near_pid: int | None = None) -> str:
        check_name(job_id)
        if job_id in self._jobs:
            return str(self._jobs[job_id])
        current = launcher_cgroups(near_pid, self._proc, lambda _: self.root) if near_pid is not None else {}
        if job_id in self._found:
            job_dir = self._found.pop(job_id)
        else:
            nest_in = self.root / parent_below(current.get(UNIFIED, "/"), self.group).lstrip("/")
            job_dir = self._parent_for(job_id, nest_in, detect_scheduler(current.values())) / self.group / job_id
        group_dir, parent = job_dir.parent, job_dir.parent.parent
        with kernel_call(job_dir, "creating the job's group"):
            group_dir.mkdir(exist_ok=True)
        self._delegate(parent)
        self._enable_subtree(group_dir)
        with kernel_call(job_dir, "creating the job's group"):
            job_dir.mkdir(exist_ok=True)
        self._jobs[job_id] = job_dir
        self._schedulers[job_id] = detect_scheduler([*current.values(), relative(job_dir, self.root)])
        return str(job_dir)

    def placement(self, job_id: str) -> Placement:
        job_dir = self._job_dir(job_id)
        offered, allowed, quota = self._scheduler_set_above(job_dir)
        capabilities = set(_capabilities_of(tuple(c for c in self._controllers if c in offered)))
        weighted_groups = {d.parent for d in self._jobs.values() if "cpu" in self._scheduler_set_above(d)[0]}
        if len(weighted_groups) > 1:
            capabilities.discard("cpu_weight")  # weights act only between siblings: some job has another parent
        return Placement(
            scheduler=self._schedulers.get(job_id, "none"),
            paths={"unified": relative(job_dir, self.root)},
            capabilities=frozenset(capabilities),
            allowed_cpus=allowed,
            cpu_limit=cpu_limit(quota, allowed),
        )

    def _scheduler_set_above(self, job_dir: Path) -> tuple[set[str], tuple[int, ...] | None, float | None]:
        """:meth:`_set_on` the job's parent, read at most once a PLACEMENT_REFRESH_S (a job whose
        parent offers no ``cpu`` has no weight to compare with its neighbours')."""
        parent = job_dir.parent.parent
        return self._scheduler_set.get(parent, lambda: self._set_on(parent))

    def _set_on(self, parent: Path) -> tuple[set[str], tuple[int, ...] | None, float | None]:
        """What the scheduler set on a job's parent: the controllers it offers, its cpuset (None:
        unreadable), the tightest CPU quota on it or above, in cores (None: none)."""
        quota = tightest_quota(parent, self.root, _quota_cores)
        return _offered(parent), read_cpus(parent / "cpuset.cpus.effective"), quota

    def attach(self, job_id: str, pid: int) -> None:
        _move(self._job_dir(job_id), pid)

    def detach(self, job_id: str, pid: int) -> None:
        """Back below the scheduler's cgroup the job came from: into the leaf our group's
        parent keeps its processes in (v2 forbids them in the parent itself), or the root."""
        target = self._home(self._job_dir(job_id))
        if target != self.root:
            with kernel_call(target, "creating a leaf for the job's training processes"):
                target.mkdir(exist_ok=True)
        _move(target, pid)

    def pids(self, job_id: str) -> set[int]:
        return read_pid_list(self._job_dir(job_id) / "cgroup.procs")

    def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
        self._require("cpu_quota", "cpu")
        quota = "max" if cores is None else str(quota_us(cores))
        write_interface(self._job_dir(job_id) / "cpu.max", f"{quota} {CFS_PERIOD_US}", "setting the CPU quota")

    def set_cpu_weight(self, job_id: str, weight: int | None) -> None:
        self._require("cpu_weight", "cpu")
        write_interface(self._job_dir(job_id) / "cpu.weight", str(check_weight(weight)), "setting the CPU weight")

    def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
        self._require("cpuset", "cpuset")
        job_dir = self._job_dir(job_id)
        if cpus is None:
            # Lifted: every CPU the job's parent group has. An empty cpuset.cpus would mean the same,
            # but a kernel refuses it for a group holding processes (ENOSPC on Linux 6.18, the lent GPU
            # machine, 2026-11-27), which is when a stopping controller lifts it.
            text = read_interface(job_dir.parent / "cpuset.cpus.effective", "reading the CPUs the job's group has")
            text = text.strip() or "\n"
        else:
            text = format_cpus(cpus)
        write_interface(job_dir / "cpuset.cpus", text, "setting the job's CPUs")

    def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
        self._require("read_bps", "io")
        major, minor = parse_device(device)
        limit = "max" if bps is None else str(check_bps(bps))
        write_interface(self._job_dir(job_id) / "io.max", f"{major}:{minor} rbps={limit}", f"throttling reads from {device}")

    def cpu_seconds(self, job_id: str) -> float:
        stat_file = self._job_dir(job_id) / "cpu.stat"
        for line in read_interface(stat_file, "reading the job's CPU time").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise BackendError(f"no usage_usec line in {stat_file}: is this a cgroup v2 group?")

    def existing_jobs(self) -> list[str]:
        """Job groups anywhere in the hierarchy (nested placement puts them below the
        schedulers' cgroups), found by one walk; also those placed by this controller."""
        for job_id, job_dir in find_job_groups(self.root, self.group).items():
            if job_id not in self._jobs:
                self._found[job_id] = job_dir
        return sorted(set(self._jobs) | set(self._found))

    def remove(self, job_id: str) -> None:
        """Move live pids back below the scheduler's cgroup the job came from (into the leaf
        when that cgroup gives controllers to children, as v2 then forbids processes in it),
        remove the job's group, and the group and leaf once no other job is left there."""
        job_dir = self._job_dir(job_id)
        group_dir, parent = job_dir.parent, job_dir.parent.parent
        target = self._home(job_dir)
        try:
            if read_pid_list(job_dir / "cgroup.procs") and target != parent:
                with kernel_call(target, "creating a leaf for the job's remaining processes"):
                    target.mkdir(exist_ok=True)
            drain_and_rmdir(job_dir, lambda: read_pid_list(job_dir / "cgroup.procs"), lambda pid: _move(target, pid))
            remove_if_unused(group_dir)
            if not group_dir.exists():
                self._undelegate(parent)
        finally:
            self._jobs.pop(job_id, None)
            self._found.pop(job_id, None)
            self._schedulers.pop(job_id, None)

    def remove_group(self) -> None:
        """The bare node's group (nested groups go with their last job, in remove())."""
        group_dir = self.root / self.group
        root_procs = self.root / "cgroup.procs"
        drain_and_rmdir(group_dir, lambda: read_pid_list(group_dir / "cgroup.procs"),
                        lambda pid: write_interface(root_procs, str(pid), f"moving pid {pid} out of the group"))

    def release(self, job_id: str) -> None:
        if "cpu" in self._controllers:
            self.set_cpu_quota(job_id, None)
            self.set_cpu_weight(job_id, None)
        if "cpuset" in self._controllers:
            self.set_cpuset(job_id, None)
        if "io" in self._controllers:
            io_max = self._job_dir(job_id) / "io.max"
            for line in read_interface(io_max, "reading the read throttles").splitlines():
                if line.strip():
                    self.set_read_bps(job_id, line.split()[0], None)

    def tidy(self) -> None:
        """Nothing to do yet: on v2 no hierarchy tells when a scheduler has finished cleaning
        up (docs/backends.md, "Known limits")."""

    # -- extras -------------------------------------------------------------------------------
    def job_of(self, pid: int) -> str | None:
        """The job whose group holds ``pid`` (from /proc/PID/cgroup's "0::" line), or None.

        Paths there are relative to the cgroup2 mount, so this assumes ``root`` is the mount's root.
        """
        return job_from_proc_cgroup(self._proc, pid, self.group, UNIFIED)


def _capabilities_of(controllers: tuple[str, ...]) -> frozenset[str]:
    """cpu.stat (usage_usec) is a core file of every v2 group, with or without the cpu controller."""
    return frozenset(
        {"groups", "cpu_accounting"} | {_CAPABILITY_OF_CONTROLLER[c] for c in controllers}
        | ({"cpu_weight"} if "cpu" in controllers else set())
    )


def _move(directory: Path, pid: int) -> None:
    write_interface(directory / "cgroup.procs", str(pid), f"moving pid {pid} into {directory.name}")


def _quota_cores(directory: Path) -> float | None:
    """The ``cpu.max`` quota set on a v2 group, in cores; None where "max" or unreadable."""
    try:
        quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def _offered(directory: Path) -> set[str]:
    """The controllers ``directory`` is given by its parent (none where that cannot be read)."""
    try:
        return _controllers(directory / "cgroup.controllers")
    except BackendError:
        return set()


_BOUNDING_LIMITS = ("memory.max", "memory.high", "pids.max")
"""Limits a job would leave behind if moved out of its cgroup (an unset one reads "max")."""


def _limits_above(root: Path, directory: Path) -> list[str]:
    """The limits set on ``directory`` or an ancestor below ``root``, as "path/file=value"."""
    found = []
    while directory != root and directory.parent != directory:
        for name in _BOUNDING_LIMITS:
            try:
                value = (directory / name).read_text().strip()
            except OSError:
                continue
            if value and value != "max":
                found.append(f"{directory / name}={value}")
        directory = directory.parent
    return found


def _withholder(root: Path, directory: Path, controller: str) -> Path:
    """The nearest ancestor of ``directory`` that is given ``controller`` (so could enable it for
    its children) where ``directory`` is not: the first cgroup.subtree_control to delegate it in."""
    while directory != root and directory.parent != directory:
        directory = directory.parent
        if directory == root or controller in _offered(directory):
            return directory
    return root


def _controllers(path: Path) -> set[str]:
    """Controller names in a cgroup.controllers / cgroup.subtree_control file ("+" prefixes tolerated)."""
    text = read_interface(path, "reading the available controllers")
    return {word.lstrip("+") for word in text.split()}
