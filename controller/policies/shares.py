"""What the model-driven policies (adaptive, jct, oracle) share once they know each
job's need: reserving an even share for jobs not yet measured, handing out the
cores and bandwidth nobody needs as headroom, and turning a plan into limits.

How a plan becomes limits: a CPU quota keeps a job's GPU fed only well above the
job's mean CPU use. Loaders work in bursts, and once a burst spends the period's
quota (CFS bandwidth control) every thread of the job, the one feeding the GPU
included, waits for the next period. Measured here (a 224 px JPEG job using 0.69
cores on average when unthrottled): quota 0.6 -> 78% of its max rate, 0.8 -> 85%,
1.0 -> 97%. So a job the plan fully satisfies gets no quota at all: its worker
count (BURST_HEADROOM times its planned cores) bounds it, and the kernel's fair
share serves its bursts. Only the jobs the plan cannot satisfy, which use every
cycle they get, are held to their share by a quota, so they cannot take what the
satisfied jobs need. A satisfied job is planned PLAN_MARGIN above its mean use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from controller.policies.base import JobAllocation, JobView, NodeResources, workers_for_cores
from throughput_model.curves import Line, concave_lines, evaluate_lines

READER_BYTES_PER_S = 1e6
"""A job reading at least this much from the managed device (at full speed) counts as a
reader: its workers block on I/O, so it gets more workers per core."""

BURST_HEADROOM = 1.5
"""Workers of a job without a quota: this many times its planned cores (see above)."""
PLAN_MARGIN = 1.15
"""Cores planned for a satisfied job, relative to its mean use at full rate."""
SATISFIED = 0.999

IO_FLOOR_FRACTION = 0.01
"""Each job keeps at least this fraction of the bandwidth, so a job that starts reading
from the device (a cold page cache) is seen reading and measured instead of stalling."""


@dataclass(frozen=True)
class JobModel:
    """A job's first-order model, T(c, io) = min(M, T_load(c), io/b)."""

    max_throughput: float
    lines: tuple[Line, ...]
    bytes_per_sample: float = 0.0

    def busy(self, cores: float, read_bps: float | None) -> float:
        """Predicted busy fraction T/M at ``cores`` and ``read_bps`` (None: unthrottled)."""
        loading = evaluate_lines(self.lines, cores)
        if read_bps is not None and self.bytes_per_sample > 0:
            loading = min(loading, read_bps / self.bytes_per_sample)
        return min(1.0, loading / self.max_throughput)

    def cores_to_saturate(self) -> float:
        """Cores at which loading keeps up with M (inf when the curve never gets there)."""
        need = 0.0
        for intercept, slope in self.lines:
            if intercept >= self.max_throughput:
                continue
            if slope <= 0:
                return math.inf
            need = max(need, (self.max_throughput - intercept) / slope)
        return need

    @property
    def is_reader(self) -> bool:
        return self.max_throughput * self.bytes_per_sample >= READER_BYTES_PER_S


def model_of(job: JobView) -> JobModel | None:
    """The job's model from what was measured or predicted; None until both M and a
    loading curve (or p) are known."""
    m = job.max_throughput
    if m is None or not m > 0 or not math.isfinite(m):
        return None
    if job.loading_curve:
        lines = concave_lines(job.loading_curve)
    elif job.cpu_s_per_sample is not None and job.cpu_s_per_sample > 0:
        lines = ((0.0, 1.0 / job.cpu_s_per_sample),)
    else:
        return None
    if not lines:
        return None
    b = job.bytes_per_sample if job.bytes_per_sample and job.bytes_per_sample > 0 else 0.0
    return with_plan_margin(JobModel(max_throughput=float(m), lines=lines, bytes_per_sample=float(b)))


def with_plan_margin(model: JobModel, margin: float = PLAN_MARGIN) -> JobModel:
    """The model a plan uses: the loading curve stretched so that every rate costs
    ``margin`` times the cores the job was seen using for it."""
    lines = tuple((intercept, slope / margin) for intercept, slope in model.lines)
    return JobModel(max_throughput=model.max_throughput, lines=lines, bytes_per_sample=model.bytes_per_sample)


def floors(node: NodeResources, jobs: int) -> tuple[float, float]:
    """(cores, bytes/s) every job keeps at least: the node's floor, or equal floors when
    more jobs than floors fit. Bandwidth 0 when it is not managed."""
    bandwidth = managed_bandwidth(node) or 0.0
    return (
        min(node.min_cores_per_job, node.cores / jobs),
        min(IO_FLOOR_FRACTION, 0.5 / jobs) * bandwidth,
    )


def managed_bandwidth(node: NodeResources) -> float | None:
    """The read bandwidth to share out, or None when the controller does not manage it."""
    if node.read_bps is None or node.read_device is None:
        return None
    return float(node.read_bps)


def spread(total: float, need: Mapping[str, float], floor: float = 0.0) -> dict[str, float]:
    """Hand out ``total`` so each job gets its need plus a share of what is left over,
    proportional to need + ``floor`` (headroom goes where the work is). Needs summing to
    more than ``total`` are returned unchanged."""
    used = sum(need.values())
    left = total - used
    if left <= 0 or not need:
        return dict(need)
    basis = {job: value + floor for job, value in need.items()}
    scale = sum(basis.values())
    if scale <= 0:
        return {job: value + left / len(need) for job, value in need.items()}
    return {job: value + left * basis[job] / scale for job, value in need.items()}


def allocations(
    node: NodeResources,
    jobs: Sequence[JobView],
    cores: Mapping[str, float],
    read_bps: Mapping[str, float] | None,
    satisfied: frozenset[str],
    readers: frozenset[str],
    workers_per_core: float,
    reader_workers_per_core: float,
) -> dict[str, JobAllocation]:
    """JobAllocations from a plan (see the module docstring): the whole managed cpuset for
    everyone; ``satisfied`` jobs no quota and BURST_HEADROOM times their planned cores in
    workers, the others their planned cores as a quota plus whatever the satisfied jobs
    were not planned to need, in proportion, and workers following that quota; more
    workers per core for jobs that read."""
    capped = {job.job_id: cores[job.job_id] for job in jobs if job.job_id not in satisfied}
    spare = node.cores - sum(cores[job.job_id] for job in jobs)
    quotas = spread(sum(capped.values()) + max(0.0, spare), capped) if capped else {}
    result: dict[str, JobAllocation] = {}
    for job in jobs:
        k = reader_workers_per_core if job.job_id in readers else workers_per_core
        if job.job_id in quotas:
            quota: float | None = min(node.cores, max(node.min_cores_per_job, quotas[job.job_id]))
            span = quota
        else:
            quota, span = None, min(node.cores, BURST_HEADROOM * cores[job.job_id])
        result[job.job_id] = JobAllocation(
            cores=None if quota is None else math.floor(quota * 1e4) / 1e4,  # rounded down: never over the node
            cpus=node.cpus,
            read_bps=None if read_bps is None else max(1, int(read_bps[job.job_id])),
            workers=workers_for_cores(span / max(1, job.ranks), k, limit=node.max_workers_per_job),
        )
    return result


def predicted_objective(
    node: NodeResources,
    jobs: Sequence[JobView],
    models: Mapping[str, JobModel],
    weights: Mapping[str, float],
    allocation: Mapping[str, JobAllocation],
) -> float:
    """Σ w·busy the models predict for ``allocation``: a job with a quota gets it; the
    jobs without share what the quotas leave, in proportion to what each needs."""
    quotas = sum(a.cores for a in allocation.values() if a.cores is not None)
    free = {j.job_id: models[j.job_id].cores_to_saturate() for j in jobs
            if j.job_id in models and allocation[j.job_id].cores is None}
    left = max(0.0, node.cores - quotas)
    need = sum(v for v in free.values() if math.isfinite(v))
    value = 0.0
    for job in jobs:
        model = models.get(job.job_id)
        if model is None:
            continue
        given = allocation[job.job_id]
        if given.cores is not None:
            cores = given.cores
        elif need > 0 and math.isfinite(free[job.job_id]):
            cores = left * min(1.0, free[job.job_id] / need) if need > left else free[job.job_id]
        else:
            cores = left / max(1, len(free))
        value += weights[job.job_id] * model.busy(cores, given.read_bps if managed_bandwidth(node) else None)
    return value
