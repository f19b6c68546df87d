"""Apply the wanted allocation to the kernel, touching only what changed.

As kubelet's cpumanager reconcile loop: the policy decides (pure), this module
diffs wanted against what is in force and calls the backend for the difference.
A value that did not change is never rewritten; a field the backend cannot
enforce is skipped (not a failure); one job's failure never stops the others,
and a field that failed keeps its old value in ``applied`` so the next control
period retries it. The only side effects are the backend calls.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from controller import faults
from controller.backends.base import BackendError, ResourceBackend
from controller.policies.base import JobAllocation, NodeResources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    job_id: str
    field: str
    """"cores", "cpu_weight", "cpus" or "read_bps"."""
    old: Any
    new: Any


@dataclass(frozen=True)
class Failure:
    job_id: str
    field: str
    error: str


@dataclass(frozen=True)
class ReconcileResult:
    applied: dict[str, JobAllocation]
    """What is now in force, for every job in ``wanted`` (``workers`` is carried over from wanted)."""
    changes: list[Change]
    failures: list[Failure]


def reconcile(
    backend: ResourceBackend,
    node: NodeResources,
    wanted: Mapping[str, JobAllocation],
    applied: Mapping[str, JobAllocation],
) -> ReconcileResult:
    """Bring every job in ``wanted`` from its ``applied`` allocation to the wanted one."""
    result_applied: dict[str, JobAllocation] = {}
    changes: list[Change] = []
    failures: list[Failure] = []
    for job_id, want in wanted.items():
        if changes:
            faults.hit("reconcile.between_jobs")  # earlier jobs have their new limits, this one not yet
        enforceable = _enforceable_fields(backend, node, job_id, want)
        # A lever that does not act on the job (here, now) holds nothing in force, whatever it was set to.
        acting = {field for field, _, _ in enforceable}
        in_force = replace(applied.get(job_id, JobAllocation()), workers=want.workers,
                           **{field: None for field in _LIMIT_FIELDS if field not in acting})
        for field, target, apply in enforceable:
            old = getattr(in_force, field)
            if _same(field, old, target):
                continue
            try:
                apply(target)
            except BackendError as exc:
                log.warning("job %s: could not set %s to %s (keeping %s, will retry): %s", job_id, field, target, old, exc)
                failures.append(Failure(job_id, field, str(exc)))
                continue
            log.info("job %s: %s %s -> %s", job_id, field, old, target)
            changes.append(Change(job_id, field, old, target))
            in_force = replace(in_force, **{field: target})
        result_applied[job_id] = in_force
    return ReconcileResult(result_applied, changes, failures)


_LIMIT_FIELDS = ("cores", "cpu_weight", "cpus", "read_bps")


def _enforceable_fields(
    backend: ResourceBackend, node: NodeResources, job_id: str, want: JobAllocation
) -> list[tuple[str, Any, Callable[[Any], None]]]:
    """(field, target value, setter) for each field that acts on this job where it is placed
    (``backend.placement(job_id).capabilities``: a lever that does nothing there is skipped)."""
    placement = backend.placement(job_id)
    levers = placement.capabilities
    fields: list[tuple[str, Any, Callable[[Any], None]]] = []
    if "cpu_quota" in levers:
        fields.append(("cores", want.cores, lambda cores: backend.set_cpu_quota(job_id, cores)))
    if "cpu_weight" in backend.capabilities:
        # A weight that stopped acting (a job arrived under another parent) is lifted, not left stale.
        weight = want.cpu_weight if "cpu_weight" in levers else None
        fields.append(("cpu_weight", weight, lambda weight: backend.set_cpu_weight(job_id, weight)))
    if "cpuset" in levers:
        fields.append(("cpus", _cpus_within(node, want, placement.allowed_cpus),
                       lambda cpus: backend.set_cpuset(job_id, cpus)))
    if "read_bps" in levers and node.read_device is not None:
        device = node.read_device
        fields.append(("read_bps", want.read_bps, lambda bps: backend.set_read_bps(job_id, device, bps)))
    return fields


def _cpus_within(node: NodeResources, want: JobAllocation, allowed: tuple[int, ...] | None) -> tuple[int, ...]:
    """The job's CPUs: the wanted ones (no cpuset wanted means all managed CPUs, not the whole
    machine), always inside what its scheduler gave it; the scheduler's own set if they share none."""
    cpus = set(want.cpus if want.cpus is not None else node.cpus)
    if allowed is not None:
        cpus = (cpus & set(allowed)) or set(allowed)
    return tuple(sorted(cpus))


def _same(field: str, old: Any, new: Any) -> bool:
    """Equal as the kernel would see it: CPU quotas are compared in millicores, so float noise is no change."""
    if field == "cores" and old is not None and new is not None:
        return round(old * 1000) == round(new * 1000)
    return old == new
