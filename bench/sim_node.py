"""A node model that drives the real, pure policies without sleeping (simulated numbers).

Each simulated job has a true loading curve (concave: T_load(c) = c / (p·(1 + κ·c)),
capped where its loader is bound by Python rather than by cores), a max throughput M,
optional reads from a shared disk, and phases (its loading cost multiplied from some
point of its run). The kernel is modelled as weighted max-min fair shares of the cores
(CFS between cgroups with cpu.shares/cpu.weight), each job using at most a core per
worker plus its main process, every sample costing more CPU the more workers the node
runs per core (``OVERSUBSCRIPTION_COST``), and a quota costing a bursty loader what it
cost here (``QUOTA_TABLE``). Every step the model measures each job as the registry would
(over a sliding window, batches counted whole, CPU accounting with noise), feeds the real
``LoadingCurveEstimator``, builds ``JobView``s and asks the real policy, through the real
loop hooks (``ChangeClock``, ``SafetyNet``) on the simulated clock.
"""
from __future__ import annotations

import dataclasses
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from bench.gpu_queue import starting_now
from controller.change_clock import ChangeClock, settling, step_period
from controller.policies.base import JobAllocation, JobView, NodeResources, Policy
from controller.policies.pending import PendingJob
from controller.policies.shares import contended_cores
from controller.safety_net import SafetyNet
from throughput_model.curves import LoadingCurveEstimator

QUOTA_TABLE = ((0.0, 0.0), (0.27, 0.276), (0.58, 0.582), (0.8, 0.746), (1.05, 0.927), (1.17, 0.95),
               (1.44, 0.963), (1.88, 0.976), (2.78, 0.992), (5.05, 1.0))
"""(quota / cores the job would use unthrottled, share of its unthrottled rate it gets):
medians by bin over the 138 JPEG job runs of the measured ``even`` runs, which give every
job a quota (bench/results/node_random.json, node.json, node_real.json of 2026-11-26, whose
training processes ran apart from the quota; ``python -m bench.replay`` refits it). A quota
near a loader's mean use costs it 5-7% (its bursts are throttled); one far below it costs
little beyond the cores. The table of the runs of 2026-11-24, whose training processes ran
under their job's quota, gave 3-7% less below a quota of one need (0.542 at 0.57, 0.696 at
0.75): with it the replayed ``even`` of the shipped mix was 2.2% idler than measured (0.623
against 0.637), 0.8% with this one. The table measured before on one 224 px job alone
(docs/policies.md: 377 of 444 samples/s, 0.85, under a quota of 0.8 cores, 1.16x its 0.69
cores' use) made replayed ``even`` runs ~4% too idle."""
MAIN_PROCESS_CORES = 0.2
"""Cores a rank's main process can use beyond its workers (collate, the training loop)."""
STARTUP_CORES = 1.0
"""Cores a starting job uses (one Python process importing and building its dataset)."""
OVERSUBSCRIPTION_COST = 0.085
"""A sample's CPU cost grows by this much per e-fold of DataLoader workers per core on the
node (1 + k·ln(workers/cores), from one worker per core up): caches and memory bandwidth
shared by more decoders, more switching. The default for a job whose own figure is not known
(``SimJob.oversubscription_cost``; bench/replay.py fits one per image side). Fitted on the
360 job runs of the seeded random mixes (bench/results/node_random.json, JPEG jobs, workers
per core from each run's allocations): CPU per sample / the mix's cost by image side = 1.117 +
0.095·ln(workers per core), the slope relative to the intercept 0.085. Static runs there had
5.7 workers per core on average, even and adaptive 1.6 and 1.9: static's samples cost ~10%
more CPU, which the model without it did not see (its adaptive/static ratios were 1.00 where
1.02-1.40 were measured)."""
WINDOW_S = 5.0
"""The registry's measurement window."""
DEFAULT_WEIGHT = 100


@dataclass(frozen=True)
class SimJob:
    """One job's truth."""

    name: str
    gpus: int
    max_throughput: float
    """M, samples/s when data never stalls."""
    cpu_s_per_sample: float
    """p: CPU seconds per sample at low core counts."""
    samples: float
    arrival_s: float = 0.0
    requested_workers: int = 4
    """DataLoader workers per rank, as the user asked."""
    batch_size: int = 32
    concavity: float = 0.005
    """κ: parallel-efficiency loss per core (T_load = c/(p(1+κc)))."""
    python_cap: float = math.inf
    """Samples/s the loader cannot exceed whatever its cores (a Python-bound loader)."""
    bytes_per_sample: float = 0.0
    """Bytes read from the shared disk per sample (0: page cache)."""
    phases: tuple[tuple[float, float], ...] = ()
    """(seconds after arrival, loading-cost multiplier from then on)."""
    ranks: int = 1
    """Training processes, each with its own loader and workers (one per GPU on a real node;
    the 2-core benchmark runs a job as one process whatever its GPUs)."""
    oversubscription_cost: float = OVERSUBSCRIPTION_COST
    """How much its sample's CPU cost grows per e-fold of DataLoader workers per core on the
    node (:func:`oversubscription_inflation`): larger images suffer more (bench/replay.py's
    OVERSUBSCRIPTION_COST_BY_SIDE)."""
    trainer_s_per_sample: float = 0.0
    """CPU seconds a sample costs in the training process itself (Python work in its loop). The
    controller keeps a training process apart from its job's CPU group
    (controller/training_processes.py): neither the job's quota nor its weight applies to this
    CPU, and the job's loading curve never sees it."""
    startup_s: float = 0.0
    """Seconds from arrival to its first batch asked for: the process starts (imports, dataset,
    workers) using STARTUP_CORES, delivers nothing, is not seen by the controller (its first
    report comes after) and is not in its busy fraction's wall (bench/report.py: the training
    loop's duration)."""

    def cost(self, age_s: float, inflation: float = 1.0) -> float:
        """CPU seconds per sample at ``age_s``: its phase's, times ``inflation`` (the node's
        oversubscription, :func:`oversubscription_inflation`)."""
        factor = 1.0
        for start, multiplier in self.phases:
            if age_s >= start:
                factor = multiplier
        return self.cpu_s_per_sample * factor * inflation

    def loading_rate(self, cores: float, age_s: float, inflation: float = 1.0) -> float:
        if cores <= 0:
            return 0.0
        p = self.cost(age_s, inflation)
        return min(self.python_cap, cores / (p * (1.0 + self.concavity * cores)))

    def cores_for(self, rate: float, age_s: float, inflation: float = 1.0) -> float:
        """Cores that deliver ``rate`` (inf when the loader can never reach it)."""
        if rate >= self.python_cap:
            return math.inf if rate > self.python_cap else self._inverse(rate, age_s, inflation)
        return self._inverse(rate, age_s, inflation)

    def _inverse(self, rate: float, age_s: float, inflation: float) -> float:
        p = self.cost(age_s, inflation)
        denominator = 1.0 - p * rate * self.concavity
        return math.inf if denominator <= 0 else p * rate / denominator


class _Step(NamedTuple):
    """What one job's loaders reported over one step of the node."""

    samples: float
    cpu_s: float
    seconds: float
    workers: int
    """Workers per rank."""
    load_s: float
    """Workers' wall seconds loading (Report.worker_load_s)."""


@dataclass
class _Live:
    spec: SimJob
    job_id: str
    done: float = 0.0
    busy_s: float = 0.0
    wall_s: float = 0.0
    ended_at: float | None = None
    estimator: LoadingCurveEstimator = field(default_factory=LoadingCurveEstimator)
    window: deque = field(default_factory=deque)
    """A _Step per step over the registry's window."""
    m_bias: float = 1.0
    submitted_s: float = 0.0
    """When it arrived; ``spec.arrival_s`` is when it started (later where it waited for GPUs)."""


@dataclass(frozen=True)
class StepRecord:
    t: float
    allocations: dict[str, tuple[float | None, int | None, int | None]]
    """Job name -> (quota cores, CPU weight, workers) in force during the step."""


@dataclass
class SimResult:
    jobs: dict[str, dict[str, float]]
    steps: list[StepRecord]
    events: list[float]
    """Arrivals, departures and phase changes (simulated seconds)."""
    decision_s: list[float]
    reverts: int
    phase_events: frozenset[float] = frozenset()
    """Those of ``events`` at which a job changed phase and none arrived or departed."""

    @property
    def gpu_busy(self) -> float:
        weighted = sum(j["gpus"] * j["busy_s"] for j in self.jobs.values())
        wall = sum(j["gpus"] * j["wall_s"] for j in self.jobs.values())
        return weighted / wall if wall > 0 else 0.0


@dataclass
class SimClock:
    """The simulated time, for the loop hooks the simulation drives (``ChangeClock``,
    ``SafetyNet``)."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class SimNode:
    cores: int
    disk_bps: float = math.inf
    """What the disk gives its readers in all, whatever the reads in flight (see ``disk_curve``)."""
    disk_curve: tuple[tuple[int, float], ...] = ()
    """Measured (reads in flight, bytes/s) of the disk (bench/disk_readers.py), interpolated
    linearly, flat beyond its ends; empty: ``disk_bps``."""
    read_bps: float | None = None
    """Read bandwidth the controller manages (--read-bps); None: not managed."""
    period_s: float = 1.0
    settle_period_s: float = 0.5
    """The period while the node settles (the controller's --settle-period; never longer than
    ``period_s``): the loop steps the same way the daemon does."""
    fetch_s_per_sample: float = 0.0
    fetch_contention_s_per_sample: float = 0.0
    """Main-process time a sample costs between its batch being ready and the next step
    starting, which no prefetching hides, and what each DataLoader worker per core on the node
    adds to it: a job whose loader keeps up is busy step / (step + batch x this), not all of
    its time (measured on the 2-core runs: bench/replay.py's FETCH_*; not measured for a
    64-core node's jobs, so 0 there)."""
    gpus: int | None = None
    """The node's GPUs: a job that does not fit in the free ones waits, first come first served
    (bench/gpu_queue.py), and the controller sees what waits; None: every job starts at arrival."""
    cpu_noise: float = 0.03
    rate_noise: float = 0.05
    """Relative noise of a window's CPU accounting and of its samples/s beyond counting whole
    batches (see bench/simulate.py for where these come from)."""

    def disk_bandwidth(self, reads_in_flight: int) -> float:
        """Bytes/s the disk gives its readers with ``reads_in_flight`` reads queued (one per worker)."""
        curve = self.disk_curve
        if not curve:
            return self.disk_bps
        if reads_in_flight <= curve[0][0]:
            return curve[0][1]
        for (n0, b0), (n1, b1) in zip(curve, curve[1:]):
            if reads_in_flight <= n1:
                return b0 + (b1 - b0) * (reads_in_flight - n0) / (n1 - n0)
        return curve[-1][1]

    def fetch_ceiling(self, max_throughput: float, ranks: int, workers_per_core: float) -> float:
        """Samples/s a job of M ``max_throughput`` reaches when its loader keeps up, with
        ``workers_per_core`` DataLoader workers per core on the node: each of its ``ranks``
        fetches its own batches, so it loses one sample's fetch time per ``ranks`` samples."""
        fetch_s = self.fetch_s_per_sample + self.fetch_contention_s_per_sample * workers_per_core
        return 1.0 / (1.0 / max_throughput + fetch_s / ranks)

    def resources(self) -> NodeResources:
        return NodeResources(cpus=tuple(range(self.cores)), read_bps=self.read_bps,
                             read_device="8:0" if self.read_bps else None)


def simulate(node: SimNode, jobs: Sequence[SimJob], policy: Policy, seed: int = 0,
             horizon_s: float = 3600.0, safety_net: bool = True) -> SimResult:
    """Run ``jobs`` on ``node`` under ``policy`` until every job is done (or ``horizon_s``)."""
    rng = random.Random(seed)
    now = 0.0
    clock = SimClock()
    change_clock = ChangeClock(clock=clock)
    net = SafetyNet(clock=clock, window_s=WINDOW_S) if safety_net else None
    resources = node.resources()
    pending = sorted(jobs, key=lambda j: j.arrival_s)
    waiting: list[SimJob] = []
    starting: list[_Live] = []
    live: dict[str, _Live] = {}
    finished: list[_Live] = []
    applied: dict[str, JobAllocation] = {}
    steps: list[StepRecord] = []
    events: list[float] = []
    phase_events: set[float] = set()
    decision_s: list[float] = []
    counter = 0
    phase_changes: list[float] = []
    while (pending or waiting or starting or live) and now < horizon_s:
        step_events: set[str] = set()
        phased = False
        while phase_changes and phase_changes[0] <= now + 1e-9:
            phase_changes.pop(0)
            phased = True  # the load changed: settle is measured from here too (the controller is not told)
        while pending and pending[0].arrival_s <= now + 1e-9:
            waiting.append(pending.pop(0))
        free = None if node.gpus is None else node.gpus - sum(j.spec.gpus for j in [*starting, *live.values()])
        for spec in starting_now(waiting, free, lambda spec: spec.gpus):
            waiting.remove(spec)
            counter += 1
            starting.append(_Live(spec=dataclasses.replace(spec, arrival_s=now) if node.gpus is not None else spec,
                                  job_id=f"j{counter:04d}", m_bias=math.exp(rng.gauss(0.0, 0.02)),
                                  submitted_s=spec.arrival_s))
            phase_changes = sorted([*phase_changes, *(now + start for start, _ in spec.phases)])
        for job in [j for j in starting if now - j.spec.arrival_s >= j.spec.startup_s - 1e-9]:
            starting.remove(job)
            live[job.job_id] = job
            step_events.add("arrival")  # its first report: the controller learns of it now
        for job in [j for j in live.values() if j.done >= j.spec.samples]:
            job.ended_at = now
            finished.append(live.pop(job.job_id))
            applied.pop(job.job_id, None)
            step_events.add("departure")
        if step_events or phased:
            events.append(now)
            if not step_events:
                phase_events.add(now)
        if not live:
            now = now + node.period_s if starting or waiting else pending[0].arrival_s if pending else now
            continue
        clock.now = now
        views = change_clock.annotate([_view(job, applied) for job in live.values()], step_events)
        if node.gpus is not None:  # what waits, as the controller learns it from the scheduler
            resources = dataclasses.replace(resources, pending=tuple(
                PendingJob(name=spec.name, gpus=spec.gpus, samples=spec.samples) for spec in waiting))
        start = time.perf_counter()
        wanted = {v.job_id: JobAllocation() for v in views}
        wanted.update({k: v for k, v in policy.allocate(resources, views).items() if k in wanted})
        decision_s.append(time.perf_counter() - start)
        if net is not None:
            wanted, _ = net.review(views, wanted, gain_driven=not step_events, node=resources)
        applied = dict(wanted)
        change_clock.applied(applied)
        steps.append(StepRecord(t=now, allocations={
            live[j].spec.name: (a.cores, a.cpu_weight, a.workers) for j, a in applied.items()}))
        period = step_period(settling(views), node.period_s, node.settle_period_s)
        _advance(node, live, starting, applied, now, period, rng)
        now += period
    for job in [*live.values(), *starting]:
        job.ended_at = now
        finished.append(job)
    return SimResult(
        jobs={j.spec.name: {"gpus": float(j.spec.gpus), "busy_s": j.busy_s, "wall_s": j.wall_s,
                            "jct_s": (j.ended_at or now) - j.submitted_s,
                            "queued_s": j.spec.arrival_s - j.submitted_s,
                            "curve_phase_changes": float(j.estimator.phase_changes)} for j in finished},
        steps=steps, events=events, phase_events=frozenset(phase_events), decision_s=decision_s,
        reverts=net.reverts if net else 0,
    )


def _view(job: _Live, applied: dict[str, JobAllocation]) -> JobView:
    spec = job.spec
    samples = sum(step.samples for step in job.window)
    cpu = sum(step.cpu_s for step in job.window)
    span = sum(step.seconds for step in job.window)
    loading = sum(step.load_s for step in job.window)
    counts = {step.workers for step in job.window}
    measured_m = spec.max_throughput * job.m_bias if job.done >= 8 * spec.batch_size else None
    return JobView(
        job_id=job.job_id, name=spec.name, gpus=spec.gpus, ranks=spec.ranks,
        requested_workers=spec.requested_workers, arrival_s=spec.arrival_s, max_throughput=measured_m,
        cpu_s_per_sample=cpu / samples if samples > 0 else None,
        bytes_per_sample=spec.bytes_per_sample if samples > 0 else None,
        loading_curve=job.estimator.points(), curve_windows=job.estimator.observations,
        curve_batches=job.estimator.evidence_batches,
        achieved=samples / span if len(job.window) >= 2 else None, batch_size=spec.batch_size,
        steady_workers=counts.pop() if len(job.window) >= 2 and len(counts) == 1 else None,
        loads_in_flight=loading / span if len(job.window) >= 2 and loading > 0 else None,
        cores_used=cpu / span if len(job.window) >= 2 and span > 0 else None,
        window_batches=samples / spec.batch_size if len(job.window) >= 2 else None,
        remaining_samples=max(0.0, spec.samples - job.done),  # declared, as `adloader run --samples` does
        length_samples=spec.samples,
        current=applied.get(job.job_id, JobAllocation()),
    )


def _advance(node: SimNode, live: dict[str, _Live], starting: Sequence[_Live], applied: dict[str, JobAllocation],
             now: float, period: float, rng: random.Random) -> None:
    """One period of the node (``period`` seconds): the kernel shares the cores (starting
    jobs' processes at the default weight), the disk is shared, jobs progress, and each job's
    window is measured."""
    demands: dict[str, float] = {job.job_id: STARTUP_CORES for job in starting}
    weights: dict[str, float] = {job.job_id: float(DEFAULT_WEIGHT) for job in starting}
    workers = {job_id: (a.workers if (a := applied.get(job_id, JobAllocation())).workers is not None
                        else job.spec.requested_workers) * job.spec.ranks for job_id, job in live.items()}
    inflation = {job_id: oversubscription_inflation(sum(workers.values()), node.cores, job.spec.oversubscription_cost)
                 for job_id, job in live.items()}
    per_core = sum(workers.values()) / node.cores
    ceiling = {job_id: node.fetch_ceiling(job.spec.max_throughput, job.spec.ranks, per_core)
               for job_id, job in live.items()}
    for job_id, job in live.items():
        a = applied.get(job_id, JobAllocation())
        age = now - job.spec.arrival_s
        cap = workers[job_id] + MAIN_PROCESS_CORES * job.spec.ranks
        # what it can use: a loader bound by Python leaves its workers waiting on a full queue
        need = min(cap, job.spec.cores_for(min(ceiling[job_id], job.spec.python_cap), age, inflation[job_id]))
        if a.cores is not None and need > 0:
            need = need * quota_share(a.cores / need)
        demands[job_id] = need
        weights[job_id] = float(a.cpu_weight or DEFAULT_WEIGHT)
        if job.spec.trainer_s_per_sample > 0:  # its training processes, apart at the default weight
            demands[_trainer(job_id)] = min(float(job.spec.ranks), min(ceiling[job_id], job.spec.python_cap)
                                            * job.spec.trainer_s_per_sample)
            weights[_trainer(job_id)] = float(DEFAULT_WEIGHT)
    cores = contended_cores(float(node.cores), weights, demands)
    rates = {job_id: min(ceiling[job_id],
                         job.spec.loading_rate(cores[job_id], now - job.spec.arrival_s, inflation[job_id]),
                         cores[_trainer(job_id)] / job.spec.trainer_s_per_sample
                         if job.spec.trainer_s_per_sample > 0 else math.inf)
             for job_id, job in live.items()}
    readers = {j: rates[j] * live[j].spec.bytes_per_sample for j in live if live[j].spec.bytes_per_sample > 0}
    read_s_per_sample: dict[str, float] = {}  # seconds a reader's worker spends reading a sample
    if readers:
        caps = {j: float(applied.get(j, JobAllocation()).read_bps or math.inf) for j in readers}
        wants = {j: min(readers[j], caps[j]) for j in readers}
        reads_in_flight = sum(workers[j] for j in readers)
        disk = node.disk_bandwidth(reads_in_flight)
        given = contended_cores(disk, {j: 1.0 for j in readers}, wants) if math.isfinite(disk) else wants
        for j in readers:
            rates[j] = min(rates[j], given[j] / live[j].spec.bytes_per_sample)
            if math.isfinite(disk) and disk > 0:  # each read in flight gets an equal share of the disk
                read_s_per_sample[j] = live[j].spec.bytes_per_sample * reads_in_flight / disk
    for job_id, job in live.items():
        spec = job.spec
        rate = rates[job_id]
        used = min(cores[job_id], spec.cores_for(rate, now - spec.arrival_s, inflation[job_id])) if rate > 0 else 0.0
        job.done += rate * period
        job.busy_s += period * rate / spec.max_throughput
        job.wall_s += period
        batches = _poisson(rng, rate * period / spec.batch_size)
        seen = batches * spec.batch_size * math.exp(rng.gauss(0.0, node.rate_noise))
        cpu = used * period * math.exp(rng.gauss(0.0, node.cpu_noise))
        # its workers load for the CPU each sample costs and, a reader's, the reads it waits on
        per_sample_s = spec.cost(now - spec.arrival_s, inflation[job_id]) + read_s_per_sample.get(job_id, 0.0)
        loading = min(float(workers[job_id]), rate * per_sample_s)
        job.window.append(_Step(seen, cpu, period, workers[job_id] // spec.ranks, loading * period))
        while sum(step.seconds for step in job.window) > WINDOW_S + 1e-9:
            job.window.popleft()
        span = sum(step.seconds for step in job.window)
        window_samples = sum(step.samples for step in job.window)
        window_cpu = sum(step.cpu_s for step in job.window)
        if window_cpu > 0:
            job.estimator.observe(window_cpu / span, window_samples / span, batches)


def _trainer(job_id: str) -> str:
    """The key of a job's training processes among the node's CPU demands."""
    return f"{job_id}/trainer"


def oversubscription_inflation(workers: float, cores: float, cost: float = OVERSUBSCRIPTION_COST) -> float:
    """What a sample's CPU cost is multiplied by with ``workers`` loader workers on ``cores``
    cores, growing by ``cost`` per e-fold of workers per core."""
    return 1.0 + cost * math.log(max(1.0, workers / cores)) if cores > 0 else 1.0


def quota_share(ratio: float) -> float:
    """QUOTA_TABLE interpolated: the share of its unthrottled rate a job gets under a quota of
    ``ratio`` times the cores it would use."""
    for (x0, y0), (x1, y1) in zip(QUOTA_TABLE, QUOTA_TABLE[1:]):
        if ratio <= x1:
            return y0 + (y1 - y0) * (ratio - x0) / (x1 - x0)
    return 1.0


def _poisson(rng: random.Random, mean: float) -> int:
    """Batches finished in a step: Poisson counts (normal approximation for large means)."""
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k
