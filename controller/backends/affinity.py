"""Unprivileged fallback: confine a job's process tree with CPU affinity; no quotas, no throttles.

Without root there are no cgroups to write, but any user may set the CPU affinity
of their own processes (sched_setaffinity). A job is the process tree under the
pids attached to it (the launcher). Children inherit affinity when they fork, so
workers started after ``set_cpuset`` are confined too; ``set_cpuset`` re-applies
the set to the whole tree each time it is called. CPU quota and read throttles
are not enforced: they are absent from ``capabilities`` so the reconciler skips
them, and their setters do nothing. Nothing survives a controller restart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from controller.backends.base import BackendError, Placement
from controller.backends.placement import cgroups_of, detect_scheduler


@dataclass
class _Job:
    roots: list[psutil.Process] = field(default_factory=list)
    """The attached processes; psutil.Process notices when a pid is reused by another process."""
    cpus: tuple[int, ...] | None = None
    """The set last applied (None: the controller's own CPUs)."""
    scheduler: str = "none"
    """Who made the cgroups the job was started in (the processes stay there)."""


class AffinityBackend:
    """CPU affinity through psutil for a job's whole process tree (works as any user)."""

    name = "affinity"
    capabilities = frozenset({"cpuset", "cpu_accounting"})

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = Path(proc)
        self._all_cpus = tuple(sorted(os.sched_getaffinity(0)))
        self._jobs: dict[str, _Job] = {}

    def _job(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise BackendError(f"job {job_id!r} has no process group in the affinity backend: create it first") from None

    def _tree(self, job: _Job) -> list[psutil.Process]:
        processes: dict[int, psutil.Process] = {}
        for root in job.roots:
            try:
                if root.is_running():
                    processes[root.pid] = root
                    processes.update((child.pid, child) for child in root.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return list(processes.values())

    def _apply(self, job_id: str, job: _Job) -> None:
        cpus = list(job.cpus or self._all_cpus)
        for process in self._tree(job):
            try:
                process.cpu_affinity(cpus)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied as exc:
                raise BackendError(
                    f"not allowed to set the CPU affinity of pid {process.pid} (job {job_id}): it belongs to "
                    "another user; run the controller as that user or as root"
                ) from exc
            except OSError as exc:
                raise BackendError(f"setting the CPU affinity of pid {process.pid} to {cpus} failed: {exc}") from exc

    # -- ResourceBackend ----------------------------------------------------------------------
    def create(self, job_id: str, near_pid: int | None = None) -> str:
        job = self._jobs.setdefault(job_id, _Job())
        if near_pid is not None:
            job.scheduler = detect_scheduler(cgroups_of(near_pid, self._proc).values())
        return f"affinity:{job_id}"

    def placement(self, job_id: str) -> Placement:
        """No group of its own: the job's processes stay wherever their scheduler put them."""
        job = self._jobs.get(job_id)
        return Placement(scheduler=job.scheduler if job else "none", capabilities=self.capabilities)

    def attach(self, job_id: str, pid: int) -> None:
        job = self._job(job_id)
        try:
            job.roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess as exc:
            raise BackendError(f"cannot attach pid {pid} to job {job_id}: the process has already exited") from exc
        if job.cpus is not None:
            self._apply(job_id, job)

    def detach(self, job_id: str, pid: int) -> None:
        raise BackendError(
            f"the affinity backend has no groups, so pid {pid} of job {job_id} cannot be kept apart from its "
            "loaders: use --backend cgroup-v1 or cgroup-v2"
        )

    def pids(self, job_id: str) -> set[int]:
        job = self._jobs.get(job_id)
        return {process.pid for process in self._tree(job)} if job else set()

    def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
        """Not enforceable without cgroups ("cpu_quota" is not a capability): nothing to do."""

    def set_cpu_weight(self, job_id: str, weight: int | None) -> None:
        """Not enforceable without cgroups ("cpu_weight" is not a capability): nothing to do."""

    def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
        job = self._job(job_id)
        if cpus is not None and not cpus:
            raise BackendError(f"empty CPU set for job {job_id}: a job must keep at least one CPU")
        job.cpus = tuple(cpus) if cpus is not None else None
        self._apply(job_id, job)

    def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
        """Not enforceable without cgroups ("read_bps" is not a capability): nothing to do."""

    def cpu_seconds(self, job_id: str) -> float:
        """CPU time of the live tree plus what its reaped children used (approximate: orphans are lost)."""
        total = 0.0
        for process in self._tree(self._job(job_id)):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def existing_jobs(self) -> list[str]:
        """Always empty: the fallback keeps its jobs in memory, so a restarted controller finds none."""
        return []

    def remove(self, job_id: str) -> None:
        job = self._jobs.pop(job_id, None)
        if job is not None and job.cpus is not None:
            job.cpus = None
            self._apply(job_id, job)

    def remove_group(self) -> None:
        """Nothing to remove: the fallback makes no groups."""

    def release(self, job_id: str) -> None:
        job = self._job(job_id)
        if job.cpus is not None:
            job.cpus = None
            self._apply(job_id, job)

    def tidy(self) -> None:
        """Nothing to do: the fallback makes no groups."""

    # -- extras -------------------------------------------------------------------------------
    def job_of(self, pid: int) -> str | None:
        """The job whose attached process is ``pid`` or one of its ancestors (from /proc/PID/stat), or None."""
        roots = {root.pid: job_id for job_id, job in self._jobs.items() for root in job.roots if root.is_running()}
        seen: set[int] = set()
        while pid > 1 and pid not in seen:
            if pid in roots:
                return roots[pid]
            seen.add(pid)
            pid = _parent_pid(self._proc, pid)
        return None


def _parent_pid(proc: Path, pid: int) -> int:
    """The ppid field of /proc/PID/stat (after the parenthesised command name); 0 if the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])
