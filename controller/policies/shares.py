"""What the model-driven policies (adaptive, jct, oracle) share once they know each
job's need: reserving an even share for jobs not yet measured, handing out the
cores and bandwidth nobody needs as headroom, and turning cores into workers.
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

BURST_HEADROOM = 1.45
"""A CPU quota keeps a job's GPU fed only well above the job's mean CPU use: loaders
work in bursts, and once a burst spends the period's quota (CFS bandwidth control)
every thread of the job, the one feeding the GPU included, waits for the next
period. Measured here (bench, a 224 px JPEG job using 0.69 cores on average when
unthrottled): quota 0.6 -> 78% of its max rate, 0.8 -> 85%, 1.0 -> 97%. So the
quota that saturates a job is taken as this factor times the cores its curve says
it uses, reached along a line from 70% of M (the knee) on."""
KNEE = 0.7

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
    return with_quota_knee(JobModel(max_throughput=float(m), lines=lines, bytes_per_sample=float(b)))


def with_quota_knee(model: JobModel, headroom: float = BURST_HEADROOM) -> JobModel:
    """The job's rate as a function of its CPU *quota*: its loading curve (rate against
    cores used), bent from KNEE·M so that it reaches M only at ``headroom`` times the
    cores it uses there (see BURST_HEADROOM)."""
    used = model.cores_to_saturate()
    if not math.isfinite(used) or used <= 0 or headroom <= 1.0:
        return model
    m = model.max_throughput
    slope = m * (1.0 - KNEE) / ((headroom - KNEE) * used)
    knee_line = (KNEE * m - slope * KNEE * used, slope)
    return JobModel(max_throughput=m, lines=model.lines + (knee_line,), bytes_per_sample=model.bytes_per_sample)


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
    readers: frozenset[str],
    workers_per_core: float,
    reader_workers_per_core: float,
) -> dict[str, JobAllocation]:
    """JobAllocations from cores and bandwidth: the whole managed cpuset for everyone (the
    quota splits it), workers following cores, more per core for jobs that read."""
    result: dict[str, JobAllocation] = {}
    for job in jobs:
        c = min(node.cores, max(node.min_cores_per_job, cores[job.job_id]))
        k = reader_workers_per_core if job.job_id in readers else workers_per_core
        result[job.job_id] = JobAllocation(
            cores=math.floor(c * 1e4) / 1e4,  # rounded down: the sum never exceeds the node
            cpus=node.cpus,
            read_bps=None if read_bps is None else max(1, int(read_bps[job.job_id])),
            workers=workers_for_cores(c / max(1, job.ranks), k, limit=node.max_workers_per_job),
        )
    return result
