"""cgroup v2 backend: one group per job at ``<root>/<group>/<job_id>`` in the unified hierarchy.

Direct writes of the kernel's interface files: cpu.max, cpuset.cpus, io.max,
cgroup.procs, and cpu.stat for accounting. The cpu, cpuset and io controllers are
enabled for the subtree in cgroup.subtree_control of the root and of the group.
Only the controllers the root offers (cgroup.controllers) become capabilities.
"""
from __future__ import annotations

from pathlib import Path

from controller.backends.base import BackendError
from controller.backends.cgroupfs import (
    CFS_PERIOD_US,
    check_bps,
    check_name,
    check_weight,
    drain_and_rmdir,
    job_from_proc_cgroup,
    kernel_call,
    parse_device,
    quota_us,
    read_interface,
    read_pid_list,
    write_interface,
)
from controller.cpuspec import format_cpus

_CAPABILITY_OF_CONTROLLER = {"cpu": "cpu_quota", "cpuset": "cpuset", "io": "read_bps"}


class CgroupV2Backend:
    """Enforces CPU quota, cpuset and read throttles through the unified hierarchy (needs root or delegation)."""

    name = "cgroup-v2"

    def __init__(self, group: str = "adloader", root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> None:
        self.group = check_name(group, "cgroup name")
        self.root = Path(root)
        self._proc = Path(proc)
        if not (self.root / "cgroup.controllers").is_file():
            raise BackendError(
                f"{self.root} is not a cgroup v2 mount (no cgroup.controllers there): pass the unified "
                "hierarchy's mount point (see `mount -t cgroup2`), or use --backend cgroup-v1 / affinity"
            )
        offered = _controllers(self.root / "cgroup.controllers")
        self._controllers = tuple(c for c in _CAPABILITY_OF_CONTROLLER if c in offered)
        # cpu.stat (usage_usec) is a core file of every v2 group, with or without the cpu controller.
        self.capabilities = frozenset(
            {"groups", "cpu_accounting"} | {_CAPABILITY_OF_CONTROLLER[c] for c in self._controllers}
            | ({"cpu_weight"} if "cpu" in self._controllers else set())
        )

    def _dir(self, job_id: str | None = None) -> Path:
        group_dir = self.root / self.group
        return group_dir / check_name(job_id) if job_id is not None else group_dir

    def _require(self, capability: str, controller: str) -> None:
        if controller not in self._controllers:
            raise BackendError(
                f"the {controller} controller is not offered in {self.root / 'cgroup.controllers'}, so "
                f"{capability} cannot be enforced: enable it in the parent's cgroup.subtree_control "
                "(or boot without cgroup_no_v1 / systemd legacy mode binding it to v1)"
            )

    def _enable_subtree(self, directory: Path) -> None:
        """Write "+cpu +cpuset +io" (those not on yet) to ``directory``/cgroup.subtree_control."""
        control = directory / "cgroup.subtree_control"
        enabled = _controllers(control)
        missing = [c for c in self._controllers if c not in enabled]
        if missing:
            write_interface(control, " ".join(f"+{c}" for c in missing), "enabling controllers for the subtree")

    # -- ResourceBackend ----------------------------------------------------------------------
    def create(self, job_id: str) -> str:
        job_dir = self._dir(job_id)
        with kernel_call(job_dir, "creating the job's group"):
            self._dir().mkdir(exist_ok=True)
        self._enable_subtree(self.root)
        self._enable_subtree(self._dir())
        with kernel_call(job_dir, "creating the job's group"):
            job_dir.mkdir(exist_ok=True)
        return str(job_dir)

    def attach(self, job_id: str, pid: int) -> None:
        write_interface(self._dir(job_id) / "cgroup.procs", str(pid), f"moving pid {pid} into the job's group")

    def pids(self, job_id: str) -> set[int]:
        return read_pid_list(self._dir(job_id) / "cgroup.procs")

    def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
        self._require("cpu_quota", "cpu")
        quota = "max" if cores is None else str(quota_us(cores))
        write_interface(self._dir(job_id) / "cpu.max", f"{quota} {CFS_PERIOD_US}", "setting the CPU quota")

    def set_cpu_weight(self, job_id: str, weight: int | None) -> None:
        self._require("cpu_weight", "cpu")
        write_interface(self._dir(job_id) / "cpu.weight", str(check_weight(weight)), "setting the CPU weight")

    def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
        self._require("cpuset", "cpuset")
        # An empty cpuset.cpus means "the parent's CPUs" in v2 (a bare newline: a zero-length write is a no-op).
        text = "\n" if cpus is None else format_cpus(cpus)
        write_interface(self._dir(job_id) / "cpuset.cpus", text, "setting the job's CPUs")

    def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
        self._require("read_bps", "io")
        major, minor = parse_device(device)
        limit = "max" if bps is None else str(check_bps(bps))
        write_interface(self._dir(job_id) / "io.max", f"{major}:{minor} rbps={limit}", f"throttling reads from {device}")

    def cpu_seconds(self, job_id: str) -> float:
        stat_file = self._dir(job_id) / "cpu.stat"
        for line in read_interface(stat_file, "reading the job's CPU time").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise BackendError(f"no usage_usec line in {stat_file}: is this a cgroup v2 group?")

    def existing_jobs(self) -> list[str]:
        group_dir = self._dir()
        if not group_dir.is_dir():
            return []
        return sorted(entry.name for entry in group_dir.iterdir() if entry.is_dir())

    def remove(self, job_id: str) -> None:
        # v2 forbids processes in a group whose subtree has controllers enabled (our group
        # directory), so live pids go to the root of the hierarchy instead.
        job_dir = self._dir(job_id)
        root_procs = self.root / "cgroup.procs"
        drain_and_rmdir(
            job_dir,
            lambda: read_pid_list(job_dir / "cgroup.procs"),
            lambda pid: write_interface(root_procs, str(pid), f"moving pid {pid} out of the job's group"),
        )

    def release(self, job_id: str) -> None:
        if "cpu" in self._controllers:
            self.set_cpu_quota(job_id, None)
            self.set_cpu_weight(job_id, None)
        if "cpuset" in self._controllers:
            self.set_cpuset(job_id, None)
        if "io" in self._controllers:
            io_max = self._dir(job_id) / "io.max"
            for line in read_interface(io_max, "reading the read throttles").splitlines():
                if line.strip():
                    self.set_read_bps(job_id, line.split()[0], None)

    # -- extras -------------------------------------------------------------------------------
    def job_of(self, pid: int) -> str | None:
        """The job whose group holds ``pid`` (from /proc/PID/cgroup's "0::" line), or None.

        Paths there are relative to the cgroup2 mount, so this assumes ``root`` is the mount's root.
        """
        return job_from_proc_cgroup(self._proc, pid, self.group, lambda ctrls: ctrls == "")


def _controllers(path: Path) -> set[str]:
    """Controller names in a cgroup.controllers / cgroup.subtree_control file ("+" prefixes tolerated)."""
    text = read_interface(path, "reading the available controllers")
    return {word.lstrip("+") for word in text.split()}
