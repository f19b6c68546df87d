"""The one record of what each job is given: wanted (the policy's decision) and applied
(what the kernel accepted), with the fields that failed to apply.

As kubelet's cpumanager ``state`` package: the policy writes wanted, the reconciler
writes applied, and the Target replies, ``adloader status``, the metrics and the state
file all read from here, so no copy can drift. ``dirty`` says whether anything changed
since the last checkpoint; the daemon then saves the state file.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

from controller.policies.base import JobAllocation


@dataclass(frozen=True)
class ApplyFailure:
    field: str
    """"cores", "cpu_weight", "cpus" or "read_bps"."""
    error: str


@dataclass(frozen=True)
class JobAllocations:
    wanted: JobAllocation = field(default_factory=JobAllocation)
    applied: JobAllocation = field(default_factory=JobAllocation)
    failures: tuple[ApplyFailure, ...] = ()
    """The fields the last reconcile could not apply (they keep their applied value and are retried)."""
    confirmed: bool = True
    """False for an allocation restored from the state file: the kernel may hold something
    else (a crash between a write and its checkpoint), so the reconciler writes every field
    once instead of trusting ``applied``."""

    @property
    def unapplied(self) -> tuple[str, ...]:
        """The fields whose wanted value is not in force."""
        return tuple(f.field for f in self.failures)


class AllocationStore:
    """wanted/applied per job id."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobAllocations] = {}
        self.dirty = False

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def get(self, job_id: str) -> JobAllocations:
        """The job's record; an empty one (nothing wanted, nothing applied) for a job not seen yet."""
        return self._jobs.get(job_id) or JobAllocations()

    def restore(self, job_id: str, wanted: JobAllocation, applied: JobAllocation) -> None:
        """What the state file says an earlier controller wanted and applied (unconfirmed)."""
        self._jobs[job_id] = JobAllocations(wanted=wanted, applied=applied, confirmed=False)

    def want(self, job_id: str, allocation: JobAllocation) -> bool:
        """Record the policy's decision; True if it changed."""
        record = self.get(job_id)
        if job_id in self._jobs and record.wanted == allocation:
            return False
        self._jobs[job_id] = replace(record, wanted=allocation)
        self.dirty = True
        return True

    def record_applied(self, job_id: str, applied: JobAllocation, failures: tuple[ApplyFailure, ...]) -> None:
        """The reconciler's result for the job: now confirmed."""
        record = self.get(job_id)
        new = replace(record, applied=applied, failures=failures, confirmed=True)
        if new != record:
            self._jobs[job_id] = new
            self.dirty = True

    def forget(self, job_id: str) -> None:
        if self._jobs.pop(job_id, None) is not None:
            self.dirty = True
