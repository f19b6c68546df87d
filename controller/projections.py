"""What each reader sees of a job, all from the same control step's measurement: the
policy's :class:`JobView`, the status :class:`JobSnapshot` and the state file's
:class:`PersistedJob`. Pure functions; the registry and the daemon call them.

A value the job has not measured yet comes, in this order, from what an earlier
controller measured (the state file), then from the node's history of the job, then
from the prediction.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from adloader.protocol import JobSnapshot
from controller.allocations import JobAllocations
from controller.policies.base import JobAllocation, JobView
from controller.priors import Recollection, first_known
from controller.state import LearntModel, PersistedJob
from controller.unmanaged import state_of

if TYPE_CHECKING:
    from controller.registry import Job


def learnt_model_of(job: "Job") -> LearntModel:
    """M, p, b and the loading-curve windows the policy plans with now."""
    rates, restored = job.measurement.rates, job.restored
    recalled = job.recollection or Recollection()
    return LearntModel(
        max_throughput=first_known(job.measurement.max_throughput, restored.max_throughput),
        cpu_s_per_sample=first_known(rates.cpu_s_per_sample, restored.cpu_s_per_sample, recalled.cpu_s_per_sample),
        bytes_per_sample=first_known(rates.bytes_per_sample, restored.bytes_per_sample, recalled.bytes_per_sample),
        loading_observations=job.loading_curve.observed(),
    )


def view_of(job: "Job", current: JobAllocation) -> JobView:
    """What the policy sees. ``current``: the allocation in force (the store's applied)."""
    model = learnt_model_of(job)
    max_tp, interval = model.max_throughput, None
    if max_tp is None and job.predicted is not None:
        max_tp, interval = job.predicted[0], (job.predicted[1], job.predicted[2])
    return JobView(
        job_id=job.job_id, name=job.name, gpus=job.gpus, ranks=job.measurement.ranks,
        requested_workers=job.requested_workers, arrival_s=job.arrival_s,
        max_throughput=max_tp, max_throughput_interval=interval,
        cpu_s_per_sample=model.cpu_s_per_sample, bytes_per_sample=model.bytes_per_sample,
        loading_curve=job.loading_curve.points(), curve_windows=job.loading_curve.observations,
        curve_batches=job.loading_curve.evidence_batches, achieved=job.measurement.rates.achieved,
        batch_size=max((report.batch_size for report in job.measurement.latest), default=None),
        steady_workers=job.measurement.steady_workers, loads_in_flight=job.measurement.rates.loads_in_flight,
        cores_used=job.measurement.cores_used, window_batches=job.measurement.rates.batches,
        remaining_samples=job.remaining,
        length_samples=job.total_samples, current=current, unmanaged=job.unmanaged_reason is not None,
    )


def snapshot_of(job: "Job", allocation: JobAllocations, pids: set[int]) -> JobSnapshot:
    """What ``adloader status`` and the metrics show: the applied limits, what failed to apply."""
    measured = job.measurement
    latest = measured.latest
    model = learnt_model_of(job)
    max_tp = model.max_throughput or (job.predicted[0] if job.predicted else None)
    idle = None
    if measured.rates.achieved is not None and max_tp and job.gpus > 0:  # no GPU, no GPU idle
        idle = min(1.0, max(0.0, 1.0 - measured.rates.achieved / max_tp))
    state = state_of(job.ended, job.unmanaged_reason, bool(latest))
    applied = allocation.applied
    # The loaders apply their worker target themselves: an unmanaged job has none to apply it.
    workers = None if job.unmanaged_reason is not None else allocation.wanted.workers
    return JobSnapshot(
        job_id=job.job_id, name=job.name, uid=job.uid, gpus=job.gpus, state=state,
        launcher_pid=job.launcher_pid, pids=tuple(sorted(pids)), cgroup=job.cgroup,
        registered_at=job.registered_at, ranks_reporting=measured.ranks_reporting,
        batch_size=latest[0].batch_size if latest else None,
        cores=applied.cores, cpu_weight=applied.cpu_weight, cpus=applied.cpus,
        read_bps=None if applied.read_bps is None else round(applied.read_bps),
        failed_to_apply={failure.field: failure.error for failure in allocation.failures},
        workers_target=None if workers is None else workers * measured.ranks,
        workers_running=sum(r.num_workers for r in latest), workers_pinned=job.pinned_workers,
        achieved_sps=measured.rates.achieved,
        max_sps_predicted=job.predicted[0] if job.predicted else None,
        max_sps_predicted_interval=(job.predicted[1], job.predicted[2]) if job.predicted else None,
        max_sps_measured=model.max_throughput, cpu_s_per_sample=model.cpu_s_per_sample,
        bytes_per_sample=model.bytes_per_sample, loading_curve=job.loading_curve.points(),
        gpu_idle_ratio=idle, data_wait_ratio=measured.rates.data_wait_ratio,
        samples_total=sum(r.samples for r in latest),
        data_wait_seconds_total=sum(r.data_wait_s for r in latest),
        compute_seconds_total=sum(r.compute_s for r in latest),
        loader_cpu_seconds_total=sum(r.worker_cpu_s for r in latest),
        loader_load_seconds_total=sum(r.worker_load_s for r in latest),
        read_bytes_total=sum(r.read_bytes for r in latest),
        cpu_seconds_total=measured.cpu_seconds, unmanaged_reason=job.unmanaged_reason,
        cores_used=measured.cores_used,
    )


def persisted_of(job: "Job", allocation: JobAllocations) -> PersistedJob:
    """What the state file keeps of the job: enough to resume its plan after a restart."""
    return PersistedJob(
        job_id=job.job_id, name=job.name, uid=job.uid, gpus=job.gpus, launcher_pid=job.launcher_pid,
        registered_at=job.registered_at, cgroup=job.cgroup, wanted=allocation.wanted, applied=allocation.applied,
        requested_workers=job.requested_workers, features=job.features, remaining_samples=job.remaining,
        model=learnt_model_of(job), pinned_workers=job.pinned_workers, declared_samples=job.declared_samples,
    )
