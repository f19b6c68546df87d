"""What the model-driven policies (adaptive, jct, oracle) share once they know each
job's need: reserving an even share for jobs not yet measured, handing out the
cores and bandwidth nobody needs as headroom, and turning a plan into limits.

How a plan of cores becomes limits: by CPU *weights*, not quotas. A quota keeps a
job's GPU fed only well above the job's mean CPU use: loaders work in bursts, and
once a burst spends the period's quota (CFS bandwidth control) every thread of the
job, the one feeding the GPU included, waits for the next period. Measured here (a
224 px JPEG job using 0.69 cores on average when unthrottled): quota 0.6 -> 78% of
its max rate, 0.8 -> 85%, 1.0 -> 97%. A quota also wastes what a job leaves unused.
Weights are work-conserving: cycles a job leaves idle go to the others.

A job the plan satisfies gets a large weight (SATISFIED_WEIGHT plus its cores): it
uses only what it needs, and with the large weight it gets that at once when it
wants it, bursts included, as a light task does under the kernel's fair share. The
jobs the plan cannot satisfy share what the satisfied ones leave, by weights in
proportion to their planned cores (at least their plan, since a satisfied job is
planned PLAN_MARGIN above its mean use), and take every cycle nobody else wants.
Workers bound how much of the node a job can occupy at all: BURST_HEADROOM times
its planned cores, or for an unsatisfied job times its share of all the cores the
satisfied jobs do not use on average.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from controller.policies.base import (
    JobAllocation, JobView, NodeResources, core_limit, cpu_controlled, plan_by_quota, worker_limit,
    workers_for_cores,
)
from throughput_model.curves import Line, concave_lines, evaluate_lines

READER_BYTES_PER_S = 1e6
"""A job reading at least this much from the managed device (at full speed) counts as a
reader: its workers block on I/O, so it gets more workers per core."""

CONTENDED_SHARE = 0.8
"""Readers whose reads at full speed sum to this share of the managed budget or more contend
for the device: their reads are planned and throttled (:func:`contended_bandwidth`). Below
it the device serves them all, as it does under ``static``; the margin is for the budget
being the operator's figure, not a measured one."""
RELEASED_SHARE = 0.6
"""Throttles, once on, come off only when the readers' demand falls below this share."""

BURST_HEADROOM = 1.5
"""Workers per planned core (see above)."""
PLAN_MARGIN = 1.15
"""Cores planned for a job, relative to its mean use at the same rate."""
WEIGHT_PER_CORE = 100
"""CPU weight per planned core: a job planned one core has the kernel's default weight."""
SATISFIED_WEIGHT = 1000
"""Added to the weight of a job the plan satisfies (see above)."""
SATISFIED = 0.999
"""A job whose planned busy fraction reaches this is satisfied."""
READS_KEEP_UP = 0.9
"""A reader reading at least this share of what it needs gets no more workers than it reads
with (:func:`reader_workers`): its reads keep up, and what it lacks is not reads in flight."""

LOADER_BUSY = 0.75
"""The share of its time a reader's worker is planned to spend loading (:func:`reader_workers`):
the rest absorbs the batches that load slower than the mean."""
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
        return self.cores_for(self.max_throughput)

    def cores_for(self, rate: float) -> float:
        """Cores at which loading delivers ``rate`` samples/s (inf when the curve never gets there)."""
        need = 0.0
        for intercept, slope in self.lines:
            if intercept >= rate:
                continue
            if slope <= 0:
                return math.inf
            need = max(need, (rate - intercept) / slope)
        return need

    def dearer(self, factor: float) -> "JobModel":
        """The model of the same job with every sample ``factor`` times dearer to load."""
        lines = tuple((intercept / factor, slope / factor) for intercept, slope in self.lines)
        return JobModel(max_throughput=self.max_throughput, lines=lines, bytes_per_sample=self.bytes_per_sample)

    @property
    def full_speed_read_bps(self) -> float:
        """Bytes/s the job reads from the device when its data never stalls (M·b)."""
        return self.max_throughput * self.bytes_per_sample

    @property
    def is_reader(self) -> bool:
        return self.full_speed_read_bps >= READER_BYTES_PER_S


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


def measured_model(job: JobView) -> JobModel | None:
    """The job's model once its loading curve is known (its first windows, or its history's
    prior); None before. The loading cost of one early window alone is no basis for a plan:
    counted in whole batches over a second or two it swung 3x between two identical jobs in
    the simulator (bench/sim_node.py), enough to give one of them every contended core."""
    return model_of(job) if job.loading_curve else None


def with_plan_margin(model: JobModel, margin: float = PLAN_MARGIN) -> JobModel:
    """The model a plan uses: the loading curve stretched so that every rate costs
    ``margin`` times the cores the job was seen using for it."""
    lines = tuple((intercept, slope / margin) for intercept, slope in model.lines)
    return JobModel(max_throughput=model.max_throughput, lines=lines, bytes_per_sample=model.bytes_per_sample)


def reserve_of(node: NodeResources, job: JobView, jobs: int) -> float:
    """Cores held for a job without a model, one of ``jobs``: an even share of the node (C/n, within
    what its scheduler allows), a placeholder until a newcomer's first reports. An unmanaged job
    (JobView.unmanaged) is never modelled: it holds what its group uses, PLAN_MARGIN above (so that
    a use held down by a contended window can grow back), up to that share; the share while its use
    is not measured. Planned from a model instead (its history's, or a prediction), it was given the
    floor while it used a core, and the jobs that report planned on that core
    (tests/test_unmanaged_share.py)."""
    share = min(node.cores / jobs, core_limit(node, job))
    if not job.unmanaged or job.cores_used is None:
        return share
    return min(share, max(node.min_cores_per_job, PLAN_MARGIN * job.cores_used))


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


def contended_bandwidth(node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel]) -> float | None:
    """The read bandwidth to plan and throttle: the node's managed budget while two or more
    jobs read from the device (known readers, or jobs whose first reports show reads) and
    would read, at full speed, at least CONTENDED_SHARE of it together (RELEASED_SHARE once
    throttles are on, so that a demand near the edge does not put them on and off); else
    None. A lone reader's throttle protects no one and caps it at the declared budget, below
    what the disk may give, so reads stay work-conserving, like the CPU weights; so do the
    throttles of readers the device serves in full. On seeded random mix 17 (2026-11-27) a
    JPEG job's first epoch, read from the disk before the page cache held it, made it a
    second reader beside a raw reader needing 40% of the budget: throttles went on for
    every job (16 MB/s for the two that read nothing) and came off 4.6 s later, once its
    window held only cached epochs, and the plan that came with them settled 5.5 s after
    the newcomers' first reports."""
    budget = managed_bandwidth(node)
    demands = [read_demand(job, model) for job in jobs if may_read(job, model := models.get(job.job_id))]
    if budget is None or len(demands) < 2:
        return None
    throttled = any(job.current.read_bps is not None for job in jobs)
    share = RELEASED_SHARE if throttled else CONTENDED_SHARE
    return budget if sum(demands) >= share * budget else None


def read_demand(job: JobView, model: JobModel | None) -> float:
    """Bytes/s ``job`` reads at full speed: its model's M·b, or before it is modelled its
    reports' bytes per sample at its measured M (at the rate it achieved while M is not yet
    measured); infinite where its reports do not say."""
    if model is not None:
        return model.full_speed_read_bps
    rate = job.max_throughput or job.achieved
    if job.bytes_per_sample is None or rate is None:
        return math.inf
    return job.bytes_per_sample * rate


def may_read(job: JobView, model: JobModel | None) -> bool:
    """Whether ``job`` may read from the managed device: its model says so, or, before it is
    modelled, its first reports' bytes per sample do (a job whose first window read from the
    page cache is no reader). A job that has not reported yet is presumed not to: presumed a
    reader, every arrival throttled the node's real reader for the seconds until the
    newcomer's first report (seeded random mixes 5, 6 and 8 lost 3-19% of GPU busy to
    ``static``, all of it on the reader); a newcomer that does read is throttled from its
    first report on, and until then the disk is shared as it is without a controller."""
    if model is None and job.bytes_per_sample is None:
        return False
    return read_demand(job, model) >= READER_BYTES_PER_S


def allocations(
    node: NodeResources,
    jobs: Sequence[JobView],
    cores: Mapping[str, float],
    read_bps: Mapping[str, float] | None,
    satisfied: frozenset[str],
    readers: Mapping[str, float],
    workers_per_core: float,
    reader_workers_per_core: float,
) -> dict[str, JobAllocation]:
    """JobAllocations from a plan of ``cores`` (see the module docstring): CPU weights and
    workers, no quota, the whole managed cpuset for everyone; a reader's workers from what
    its reads need (:func:`reader_workers`), ``readers`` mapping each to the bytes/s it
    reads at full speed. Where weights do not reach every job (jobs under different parent
    cgroups, see JobView.levers), each job's span becomes its quota instead; a job no weight or
    quota acts on gets neither (its workers still follow the plan)."""
    by_weight = not plan_by_quota(jobs)
    planned = spread(node.cores, {job.job_id: cores[job.job_id] for job in jobs})
    unsatisfied = [job.job_id for job in jobs if job.job_id not in satisfied]
    free = node.cores - sum(cores[job_id] / PLAN_MARGIN for job_id in satisfied)
    unsatisfied_plan = sum(planned[job_id] for job_id in unsatisfied)
    result: dict[str, JobAllocation] = {}
    for job in jobs:
        most = core_limit(node, job)
        c = min(most, max(node.min_cores_per_job, planned[job.job_id]))
        if job.job_id in satisfied:
            weight, span = SATISFIED_WEIGHT + WEIGHT_PER_CORE * c, c
        else:
            weight, span = WEIGHT_PER_CORE * c, min(most, max(c, free * planned[job.job_id] / unsatisfied_plan))
        limit = worker_limit(node, job)
        if job.unmanaged:
            workers = None  # no loader of ours to set
        elif job.job_id in readers and job.requested_workers:
            need = readers[job.job_id]
            if read_bps is not None:
                need = min(need, read_bps[job.job_id])
            elif (bandwidth := managed_bandwidth(node)) is not None:
                need = min(need, bandwidth)
            workers = reader_workers(job, need, limit)
        else:
            k = reader_workers_per_core if job.job_id in readers else workers_per_core
            workers = workers_for_span(node, job, span, k)
        controlled = cpu_controlled(job)
        result[job.job_id] = JobAllocation(
            cpu_weight=max(1, min(10_000, round(weight))) if by_weight and controlled else None,
            cores=None if by_weight or not controlled else min(node.cores, span),
            cpus=node.cpus,
            read_bps=None if read_bps is None else max(1, int(read_bps[job.job_id])),
            workers=workers,
        )
    return result


def workers_for_span(node: NodeResources, job: JobView, cores: float, workers_per_core: float) -> int:
    """Workers a rank for a job that may occupy ``cores`` of the node: BURST_HEADROOM a core,
    ``workers_per_core`` each, within what its memory holds (base.worker_limit)."""
    return workers_for_cores(BURST_HEADROOM * min(cores, node.cores) / max(1, job.ranks), workers_per_core,
                             limit=worker_limit(node, job))


def workers_follow_reads(node: NodeResources, models: Mapping[str, JobModel]) -> dict[str, float]:
    """The readers whose workers wait on the device more than they compute, each with the bytes/s
    it reads at full speed: their workers follow their reads (:func:`reader_workers`). A job is
    one when a sample's bytes take longer at the node's whole managed bandwidth than the CPU one
    core spends on it (where the bandwidth is not managed, every reader is). A JPEG job reading
    its files from a cold page cache passes READER_BYTES_PER_S, but its workers decode: 30 KB a
    sample takes 0.05 ms at 600 MB/s against 2.2 ms of CPU. Given workers by its reads, at a
    quarter of its full speed it got four for the one core planned (jct_lengths, a change 5.5 s
    after the first reports); it gets workers for its cores."""
    bandwidth = managed_bandwidth(node)
    return {
        job_id: model.full_speed_read_bps for job_id, model in models.items()
        if model.is_reader and (bandwidth is None or _waits_on_reads(model, bandwidth))
    }


def _waits_on_reads(model: JobModel, bandwidth: float) -> bool:
    per_core = evaluate_lines(model.lines, 1.0)
    return per_core <= 0 or model.bytes_per_sample / bandwidth >= 1.0 / per_core


def reader_workers(job: JobView, need_bps: float, limit: int) -> int:
    """Workers per rank for a reader: as many reads in flight as it takes to read ``need_bps``
    (its full-speed reads, at most its planned or the node's declared bandwidth), no more than
    it asked for. A reader's workers mostly wait on the disk, and the disk, not the cores,
    decides how many help: on this project's 2-core VM an O_DIRECT reader alone (64 x 768 KiB
    samples a batch) read 873 MB/s with 1 worker, 801 with 2 and 700 with 4 or 8
    (bench/results/disk_readers.json), where an NVMe drive reads faster the more reads are in
    flight. So the count comes from what its workers read over the last window at a steady
    count w (JobView.steady_workers): by Little's law reads in flight = rate x latency, and
    at that latency it takes ceil(w x need / read) workers: w, or fewer where it reads well
    beyond its need, more where it reads less. Before its count was steady for a window it
    keeps the workers it holds, or gets those it asked for, unless its loading was timed (below).
    Its CPU weight still caps its CPU.

    A reader reading within ``READS_KEEP_UP`` of its need gets no more workers than it reads
    with: a reader whose reads keep its GPUs busy still counts a little short of its full
    speed (its epoch starts, and a rate counted in whole batches over a one-second window),
    and by the law alone every such reader got one worker more than it read with. On seeded
    random mix 6 a 4-GPU reader at 96% of its need (eight 32-sample batches a second) went
    from 3 workers to 4; the even split ran it on one and it was busier (0.97 against 0.955).

    The reads in flight are the workers' measured loading time over the window
    (JobView.loads_in_flight), not all w of them, where the loader timed it: a reader whose GPUs
    take batches slower than its workers load them has workers idle, waiting for a task, and
    counting them all kept it at three where one loaded each batch in 26-30 ms, eight a second
    (random mix 6). Its workers then paid at each epoch start, their first reads sharing the
    device: 35-49 ms before the first batch against one worker's 26-30, and its 256-sample
    epochs last a second. A worker is counted as needed at LOADER_BUSY busy, so a loader
    keeping up with a queue of tasks is not cut to the last worker it needs on average. Timed
    loading holds across a change of count (the time a batch takes to load, not the count,
    is what it measures), so it is used before the count was steady for a window."""
    asked = min(job.requested_workers or limit, limit)
    held = min(job.current.workers or asked, asked)
    reading = (job.achieved or 0.0) * (job.bytes_per_sample or 0.0)
    if reading <= 0 or not (job.steady_workers or job.loads_in_flight is not None):
        return held
    workers = job.steady_workers or held
    loading = float(workers)
    if job.loads_in_flight is not None:
        loading = min(loading, _busy_workers(job))
    in_flight = math.ceil(loading * need_bps / reading - 1e-9)
    if reading >= READS_KEEP_UP * need_bps:
        in_flight = min(in_flight, workers)
    return max(1, min(asked, in_flight))


def idle_reader_workers(job: JobView, bandwidth: float | None) -> int | None:
    """The workers per rank a reader keeping up with its GPUs needs by its timed loading, where
    fewer than it holds: ceil(its loads in flight a rank / LOADER_BUSY), at least one. A reader
    here waits on the device more than it computes: a sample's bytes at ``bandwidth`` (the
    node's managed read bandwidth; None: not managed, any job reading is one) take longer than
    its CPU for it. It keeps up when it delivers READS_KEEP_UP of its measured M (a predicted M
    is no basis for a cut). None: not such a reader, not timed, or no worker to spare. Needs
    no loading curve: only the window's rates and its loaders' timing (see reader_workers)."""
    held = job.current.workers
    if not held or job.loads_in_flight is None or not job.achieved or not job.max_throughput \
            or job.max_throughput_interval is not None or job.achieved < READS_KEEP_UP * job.max_throughput:
        return None
    bytes_per_sample = job.bytes_per_sample or 0.0
    if bytes_per_sample * job.achieved < READER_BYTES_PER_S:
        return None
    if bandwidth is not None and bytes_per_sample / bandwidth < (job.cpu_s_per_sample or 0.0):
        return None
    needed = max(1, math.ceil(_busy_workers(job) - 1e-9))
    return needed if needed < held else None


def _busy_workers(job: JobView) -> float:
    """Workers per rank that load the batches ``job``'s loaders were timed loading at once, each
    LOADER_BUSY of its time."""
    return (job.loads_in_flight or 0.0) / max(1, job.ranks) / LOADER_BUSY


def contended_cores(total: float, weights: Mapping[str, float], demands: Mapping[str, float]) -> dict[str, float]:
    """What the kernel gives each job of ``total`` cores: weighted max-min fair shares,
    a job never getting more than it ``demands`` (inf: all it can get). Summed in the order of
    ``demands``, not of a set of job ids, whose order changes with each process's string hashing:
    the last bits of the shares did, and a plan at the edge of its gain threshold came out one
    way or the other from one run of the simulator to the next."""
    given: dict[str, float] = {}
    active = [job for job in demands if weights.get(job, 0) > 0]
    left = total
    while active and left > 1e-12:
        scale = left / sum(weights[job] for job in active)
        capped = [job for job in active if demands[job] <= weights[job] * scale]
        if not capped:
            for job in active:
                given[job] = weights[job] * scale
            return {job: given.get(job, 0.0) for job in demands}
        for job in capped:
            given[job] = demands[job]
            left -= demands[job]
        active = [job for job in active if job not in given]
    return {job: given.get(job, 0.0) for job in demands}


def predicted_objective(
    node: NodeResources,
    jobs: Sequence[JobView],
    models: Mapping[str, JobModel],
    weights: Mapping[str, float],
    allocation: Mapping[str, JobAllocation],
) -> float:
    """Σ w·busy the models predict for ``allocation`` (see :func:`predicted_busy`)."""
    return sum(weights[job_id] * busy for job_id, busy in predicted_busy(node, jobs, models, allocation).items())


def predicted_busy(
    node: NodeResources,
    jobs: Sequence[JobView],
    models: Mapping[str, JobModel],
    allocation: Mapping[str, JobAllocation],
) -> dict[str, float]:
    """Each modelled job's busy fraction the models predict for ``allocation``: each job
    demands what saturates it, at most its quota if it has one and a core per worker, and
    the cores are shared by CPU weight."""
    demands: dict[str, float] = {}
    for job in jobs:
        model = models.get(job.job_id)
        given = allocation[job.job_id]
        if model is not None:
            demand = model.cores_to_saturate()
        elif job.unmanaged and job.cores_used is not None:
            demand = job.cores_used  # what it takes, whatever it is planned
        else:
            demand = node.cores / len(jobs)
        if given.cores is not None:
            demand = min(demand, given.cores)
        if given.workers is not None:
            demand = min(demand, float(given.workers * max(1, job.ranks)))
        demands[job.job_id] = demand
    cpu_weights = {j: float(allocation[j].cpu_weight or WEIGHT_PER_CORE) for j in demands}
    cores = contended_cores(node.cores, cpu_weights, demands)
    bandwidth = managed_bandwidth(node)
    return {
        job.job_id: model.busy(cores[job.job_id], allocation[job.job_id].read_bps if bandwidth else None)
        for job in jobs
        if (model := models.get(job.job_id)) is not None
    }
