"""The backend seam: the only code that touches the kernel to enforce an allocation.

Implementations: cgroup v1 (cgroupspy), cgroup v2 (direct file writes), and an
unprivileged fallback (CPU affinity through psutil). Every root they touch is a
constructor argument so tests can point them at a fixture tree. The reconciler
calls the ``set_*`` methods only for values that changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from adloader.errors import AdloaderError


class BackendError(AdloaderError):
    """The kernel refused a change or a cgroup is missing; the message says which file and what to do."""


@dataclass(frozen=True)
class Placement:
    """Where one job's group sits and what can be enforced on it there (nested placement)."""

    scheduler: str = "none"
    """Who made the cgroup the job was started in: "slurm", "kubernetes", "systemd" or "none"."""
    paths: Mapping[str, str] = field(default_factory=dict)
    """The job group's path in each hierarchy it manages, as /proc/PID/cgroup shows it
    ("cpu", "cpuset", ... on v1; "unified" on v2)."""
    capabilities: frozenset[str] = frozenset()
    """The levers that act on this job: the backend's capabilities less those its parent
    cannot give (a v2 parent that does not offer a controller) or that do not reach the
    other jobs (CPU weights act only between jobs with the same parent)."""
    allowed_cpus: tuple[int, ...] | None = None
    """The CPUs the scheduler gave the job (its parent's effective cpuset); None: unknown or all."""
    cpu_limit: float | None = None
    """The most cores the job can use there: the tightest CPU quota its scheduler set on its
    parent or above (a pod's limit), and the CPUs of ``allowed_cpus``; None: no limit known."""


class ResourceBackend(Protocol):
    name: str
    """"cgroup-v1", "cgroup-v2" or "affinity"."""
    capabilities: frozenset[str]
    """Subset of {"cpu_quota", "cpu_weight", "cpuset", "read_bps", "cpu_accounting", "groups"}: what it can enforce."""

    def create(self, job_id: str, near_pid: int | None = None) -> str:
        """Create the job's group (idempotent: an existing one is adopted) below the cgroup
        ``near_pid`` is in, in each hierarchy (None: the root, or where an adopted group
        already is). Returns its path for display."""

    def placement(self, job_id: str) -> Placement:
        """Where the job's group is, the scheduler that made its parent, and the levers that act on it."""

    def attach(self, job_id: str, pid: int) -> None:
        """Move ``pid`` into the job's group; its future children are born inside."""

    def detach(self, job_id: str, pid: int) -> None:
        """Move ``pid`` (a training process) out of the job's CPU group, back to the cgroup the
        job came from, so that the job's CPU weight and quota no longer act on it; its later
        children are born there (controller/training_processes.py moves them back). BackendError
        where there are no groups."""

    def pids(self, job_id: str) -> set[int]:
        """Live pids inside the job's group (for the fallback: the launcher's process tree)."""

    def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
        """Limit the group to ``cores`` CPUs' worth of time; None removes the limit."""

    def set_cpu_weight(self, job_id: str, weight: int | None) -> None:
        """Weight the group's share of contended CPUs (cpu.weight scale, see
        JobAllocation.cpu_weight); None restores the kernel's default."""

    def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
        """Confine the group to CPU ids ``cpus``; None means every CPU of the parent."""

    def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
        """Throttle reads from block device ``device`` ("major:minor"); None removes the throttle."""

    def cpu_seconds(self, job_id: str) -> float:
        """CPU time used by the whole group since it was created."""

    def existing_jobs(self) -> list[str]:
        """Job ids of groups found under this backend's root (left by an earlier controller)."""

    def remove(self, job_id: str) -> None:
        """Remove the job's group. Live pids still inside are moved to the parent first."""

    def release(self, job_id: str) -> None:
        """Lift every limit the backend set on the job but keep the group (controller shutdown)."""

    def tidy(self) -> None:
        """Once per control period: remove what a scheduler had to leave behind because a
        job's group was nested in its cgroups when it cleaned up (cgroup v1, see CgroupV1Backend)."""

    def remove_group(self) -> None:
        """Remove the (job-free) group under which job groups are made, moving any pid still
        in it to the parent; a missing group is already removed (uninstall)."""
