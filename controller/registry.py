"""The controller's picture of its jobs: who registered, what each rank reported, and the
rates derived from those reports over a sliding window.

Reports carry cumulative counters (samples, data-wait and compute seconds, loader CPU
seconds, bytes read). Rates are differences between the oldest and newest report of
each rank inside the window, summed over ranks:

- achieved T = d(samples)/dt, the job's samples/s;
- data-wait ratio = d(data_wait_s) / (d(data_wait_s) + d(compute_s));
- measured max throughput M = d(samples)/d(compute_s): the rate if data never stalled;
- loader CPU seconds per sample p = d(worker_cpu_s)/d(samples);
- bytes read per sample b = d(read_bytes)/d(samples).

The registry does no I/O: the daemon hands it pids and CPU seconds read from the
backend when it asks for snapshots. It builds the policy's JobViews and the
read-only JobSnapshots; it never decides anything.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from adloader.protocol import Report
from controller.policies.base import JobAllocation, JobView
from controller.snapshot import JobSnapshot
from controller.state import PersistedJob
from throughput_model.curves import LoadingCurveEstimator

log = logging.getLogger(__name__)

Predictor = Callable[[dict[str, float], int], "tuple[float, float, float] | None"]
"""(features, gpus) -> (M, low, high) samples/s, or None when it cannot tell."""
JobFinishedHook = Callable[
    [JobSnapshot, "dict[str, float] | None", "tuple[tuple[float, float], ...]", "int | None"], None]
"""(final snapshot, the job's model features, its fitted loading-curve points, its exit code or None
if the launcher went away without one): the job history's input."""
Recall = Callable[[str, "dict[str, float] | None"], "Recollection | None"]
"""(name, features) -> what earlier runs of the same job measured, or None (not a recurring job)."""


@dataclass(frozen=True)
class Recollection:
    """What the node remembers of a recurring job's earlier runs (A-SRPT: most jobs recur).
    It stands in for measurements until the job's own arrive, so its first allocation is
    already sized: its length for ``jct``, its loading cost for every policy."""

    samples: float | None = None
    cpu_s_per_sample: float | None = None
    bytes_per_sample: float | None = None

MIN_BATCHES_FOR_M = 8
"""The policy gets a measured M once a rank has run this many steps (until then the
prediction, if any): the first steps are warm-up."""


@dataclass(frozen=True)
class Rates:
    """What the reports of one job say over the window (None: not enough data yet)."""

    achieved: float | None = None
    data_wait_ratio: float | None = None
    max_throughput: float | None = None
    cpu_s_per_sample: float | None = None
    bytes_per_sample: float | None = None
    loader_cores: float | None = None
    """Cores the loader workers used: d(worker_cpu_s)/dt."""


@dataclass
class Job:
    """One registered job. Mutable; only the registry changes it."""

    job_id: str
    name: str
    uid: int
    gpus: int
    launcher_pid: int
    registered_at: float
    """Unix time of registration."""
    arrival_s: float
    """Seconds since this controller started (negative for jobs adopted from an earlier run)."""
    cgroup: str
    requested_workers: int | None = None
    features: dict[str, float] | None = None
    predicted: tuple[float, float, float] | None = None
    """(M, low, high) from the predictor, until measurements take over."""
    remaining_samples: float | None = None
    total_samples: int | None = None
    """The job's length as it declared it at registration (``adloader run --samples``)."""
    allocation: JobAllocation = field(default_factory=JobAllocation)
    """The policy's latest decision for the job (the Target replies carry it)."""
    connected: bool = True
    """The launcher's registration connection is open."""
    exit_code: int | None = None
    """Set by End: the command has exited and the job no longer gets a share."""
    adopted: bool = False
    ranks: dict[int, deque[tuple[float, Report]]] = field(default_factory=dict)
    loading_curve: LoadingCurveEstimator = field(default_factory=LoadingCurveEstimator)
    """Fit of (cores, loading samples/s) from the job's windows (a recurring job's starts from its history)."""
    recollection: Recollection | None = None
    """What earlier runs of the same job measured (None: it has not run on this node)."""
    cpu_samples: deque[tuple[float, float]] = field(default_factory=deque)
    """(monotonic time, CPU seconds of the job's whole group) over the window."""

    @property
    def ended(self) -> bool:
        return self.exit_code is not None


class Registry:
    """Jobs by id, plus the windowed rates of their reports."""

    def __init__(
        self,
        *,
        window_s: float = 5.0,
        predictor: Predictor | None = None,
        on_job_finished: JobFinishedHook | None = None,
        recall: Recall | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self._predictor = predictor
        self._on_job_finished = on_job_finished
        self._recall = recall
        self._clock = clock
        self._wall_clock = wall_clock
        self._started_wall = wall_clock()
        self._jobs: dict[str, Job] = {}

    # ------------------------------------------------------------------ the job set

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[Job]:
        return iter(sorted(self._jobs.values(), key=lambda j: (j.arrival_s, j.job_id)))

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def new_job_id(self) -> str:
        """A fresh id that names a cgroup directory: "j" and 8 hex digits."""
        while True:
            job_id = "j" + secrets.token_hex(4)
            if job_id not in self._jobs:
                return job_id

    def register(
        self,
        job_id: str,
        *,
        name: str,
        uid: int,
        gpus: int,
        launcher_pid: int,
        cgroup: str,
        requested_workers: int | None = None,
        features: dict[str, float] | None = None,
        total_samples: int | None = None,
    ) -> Job:
        now = self._wall_clock()
        job = Job(
            job_id=job_id, name=name, uid=uid, gpus=gpus, launcher_pid=launcher_pid, registered_at=now,
            arrival_s=now - self._started_wall, cgroup=cgroup, requested_workers=requested_workers,
            features=features, total_samples=total_samples,
        )
        self._remember(job)
        job.predicted = self._predict(job)
        self._jobs[job_id] = job
        return job

    def _remember(self, job: Job) -> None:
        """Give a recurring job what its earlier runs measured: its length (unless it declared
        one) and its loading cost, the prior of its loading curve until its own windows count."""
        recollection = self._recall(job.name, job.features) if self._recall is not None else None
        if recollection is None:
            return
        job.recollection = recollection
        if job.total_samples is None and recollection.samples:
            job.total_samples = int(recollection.samples)
        if recollection.cpu_s_per_sample:
            job.loading_curve = LoadingCurveEstimator(prior_cpu_s_per_sample=recollection.cpu_s_per_sample)
        log.info("job %s (%s) recurs: expecting %s samples at %s ms of CPU each, as its earlier runs",
                 job.job_id, job.name, f"{job.total_samples:d}" if job.total_samples else "unknown",
                 f"{1000 * recollection.cpu_s_per_sample:.2f}" if recollection.cpu_s_per_sample else "unknown")

    def adopt(self, persisted: PersistedJob) -> Job:
        """Take over a job an earlier controller registered; its launcher's connection is gone."""
        job = Job(
            job_id=persisted.job_id, name=persisted.name, uid=persisted.uid, gpus=persisted.gpus,
            launcher_pid=persisted.launcher_pid, registered_at=persisted.registered_at,
            arrival_s=persisted.registered_at - self._started_wall, cgroup=persisted.cgroup,
            requested_workers=persisted.requested_workers, features=persisted.features,
            remaining_samples=persisted.remaining_samples, allocation=persisted.allocation,
            connected=False, adopted=True,
        )
        job.predicted = self._predict(job)
        self._jobs[job.job_id] = job
        return job

    def remove(self, job_id: str, *, pids: set[int], cpu_seconds: float) -> JobSnapshot | None:
        """Forget the job; hand its final snapshot to the on_job_finished hook (job history)."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return None
        final = self.snapshot(job, pids=pids, cpu_seconds=cpu_seconds)
        if self._on_job_finished is not None:
            try:
                self._on_job_finished(final, job.features, tuple(job.loading_curve.points()), job.exit_code)
            except Exception:  # a history bug must not stop the controller from freeing the job
                log.exception("on_job_finished hook failed for job %s", job_id)
        return final

    def persisted(self) -> dict[str, PersistedJob]:
        """What the state file keeps of every job."""
        return {
            job.job_id: PersistedJob(
                job_id=job.job_id, name=job.name, uid=job.uid, gpus=job.gpus, launcher_pid=job.launcher_pid,
                registered_at=job.registered_at, cgroup=job.cgroup, allocation=job.allocation,
                requested_workers=job.requested_workers, features=job.features,
                remaining_samples=self.remaining_samples(job),
            )
            for job in self
        }

    # ------------------------------------------------------------------ events

    def record_report(self, job_id: str, report: Report) -> None:
        """Add one rank's cumulative counters. A rank whose counters went backwards restarted:
        its window starts over."""
        job = self._jobs[job_id]
        now = self._clock()
        window = job.ranks.setdefault(report.rank, deque())
        if window and report.samples < window[-1][1].samples:
            window.clear()
        window.append((now, report))
        while len(window) > 1 and window[0][0] < now - self.window_s:
            window.popleft()
        if report.features and not job.features:
            job.features = dict(report.features)
            job.predicted = self._predict(job)

    def set_allocation(self, job_id: str, allocation: JobAllocation) -> bool:
        """Record the policy's decision; True if it changed."""
        job = self._jobs[job_id]
        if job.allocation == allocation:
            return False
        job.allocation = allocation
        return True

    def disconnected(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.connected = False

    def end(self, job_id: str, exit_code: int) -> None:
        self._jobs[job_id].exit_code = exit_code

    # ------------------------------------------------------------------ derived

    def rates(self, job: Job) -> Rates:
        """Windowed rates summed over the ranks that reported at least twice in the window."""
        now = self._clock()
        samples = wait = compute = cpu = read = achieved = max_tp = loader_cores = 0.0
        have_tp = have_any = False
        for window in job.ranks.values():
            points = [(t, r) for t, r in window if t >= now - self.window_s]
            if len(points) < 2:
                continue
            (t0, first), (t1, last) = points[0], points[-1]
            if t1 <= t0:
                continue
            d_samples = last.samples - first.samples
            d_compute = last.compute_s - first.compute_s
            samples += d_samples
            wait += last.data_wait_s - first.data_wait_s
            compute += d_compute
            cpu += last.worker_cpu_s - first.worker_cpu_s
            read += last.read_bytes - first.read_bytes
            achieved += d_samples / (t1 - t0)
            loader_cores += (last.worker_cpu_s - first.worker_cpu_s) / (t1 - t0)
            if d_compute > 0:
                max_tp += d_samples / d_compute
                have_tp = True
            have_any = True
        if not have_any:
            return Rates()
        step = wait + compute
        return Rates(
            achieved=achieved,
            data_wait_ratio=wait / step if step > 0 else None,
            max_throughput=max_tp if have_tp and samples > 0 else None,
            cpu_s_per_sample=cpu / samples if samples > 0 else None,
            bytes_per_sample=read / samples if samples > 0 else None,
            loader_cores=loader_cores if loader_cores > 0 else None,
        )

    def predict_pending(self) -> None:
        """Once per control step: ask again for the jobs whose prediction was not ready at
        registration (the predictor loads its model off the event loop and says None meanwhile)."""
        for job in self:
            if job.predicted is None and job.features and not job.ended:
                job.predicted = self._predict(job)

    def observe_loading(self, cpu_seconds: Mapping[str, float] | None = None) -> None:
        """Once per control step: each running job's window is a point of its loading curve,
        (cores it used, samples/s delivered), whether or not the loader was the bottleneck
        (throughput_model.curves explains why). ``cpu_seconds``: each job's group CPU time
        (the backend's accounting), so the cores are the whole job's, main process included,
        which is what a quota limits; a job missing from it counts its loader workers' CPU."""
        now = self._clock()
        for job in self:
            if job.ended:
                continue
            rates = self.rates(job)
            cores = rates.loader_cores
            if cpu_seconds is not None and job.job_id in cpu_seconds:
                job.cpu_samples.append((now, cpu_seconds[job.job_id]))
                while len(job.cpu_samples) > 2 and job.cpu_samples[0][0] < now - self.window_s:
                    job.cpu_samples.popleft()
                (t0, first), (t1, last) = job.cpu_samples[0], job.cpu_samples[-1]
                cores = (last - first) / (t1 - t0) if t1 > t0 and last > first else None
            if rates.achieved is not None and cores is not None:
                job.loading_curve.observe(cores, rates.achieved)

    def views(self, applied: Mapping[str, JobAllocation]) -> list[JobView]:
        """What the policy sees: every job that has not ended, oldest first. ``current`` is the
        allocation in force (``applied``), else the last decision (adopted jobs at the first loop)."""
        views = []
        for job in self:
            if job.ended:
                continue
            rates = self.rates(job)
            recalled = job.recollection or Recollection()
            max_tp, interval = self.measured_max_throughput(job), None
            if max_tp is None and job.predicted is not None:
                max_tp, interval = job.predicted[0], (job.predicted[1], job.predicted[2])
            views.append(
                JobView(
                    job_id=job.job_id, name=job.name, gpus=job.gpus, ranks=self._ranks(job),
                    requested_workers=job.requested_workers, arrival_s=job.arrival_s,
                    max_throughput=max_tp, max_throughput_interval=interval,
                    cpu_s_per_sample=_first(rates.cpu_s_per_sample, recalled.cpu_s_per_sample),
                    bytes_per_sample=_first(rates.bytes_per_sample, recalled.bytes_per_sample),
                    loading_curve=job.loading_curve.points(), achieved=rates.achieved,
                    remaining_samples=self.remaining_samples(job), current=applied.get(job.job_id, job.allocation),
                )
            )
        return views

    def measured_max_throughput(self, job: Job) -> float | None:
        """M over each rank's whole run (its cumulative counters: samples / compute seconds),
        summed over the ranks with MIN_BATCHES_FOR_M steps. A window of a few seconds holds
        only a few steps of a starved job, and its partial step at each end swings M by half."""
        total = 0.0
        for window in job.ranks.values():
            last = window[-1][1] if window else None
            if last is not None and last.batches >= MIN_BATCHES_FOR_M and last.compute_s > 0:
                total += last.samples / last.compute_s
        return total or None

    def remaining_samples(self, job: Job) -> float | None:
        """Samples left: the declared length minus what the ranks reported, else what
        history or the state file said (None: unknown)."""
        if job.total_samples is None:
            return job.remaining_samples
        done = sum(window[-1][1].samples for window in job.ranks.values() if window)
        return float(max(0, job.total_samples - done))

    def snapshot(self, job: Job, *, pids: set[int], cpu_seconds: float) -> JobSnapshot:
        rates = self.rates(job)
        latest = [window[-1][1] for window in job.ranks.values() if window]
        max_tp = rates.max_throughput or (job.predicted[0] if job.predicted else None)
        idle = None
        if rates.achieved is not None and max_tp:
            idle = min(1.0, max(0.0, 1.0 - rates.achieved / max_tp))
        if job.ended:
            state = "gone"
        elif latest:
            state = "running"
        else:
            state = "starting"
        alloc = job.allocation
        return JobSnapshot(
            job_id=job.job_id, name=job.name, uid=job.uid, gpus=job.gpus, state=state,
            launcher_pid=job.launcher_pid, pids=tuple(sorted(pids)), cgroup=job.cgroup,
            registered_at=job.registered_at, ranks_reporting=self._ranks_reporting(job),
            batch_size=latest[0].batch_size if latest else None,
            cores=alloc.cores, cpu_weight=alloc.cpu_weight, cpus=alloc.cpus, read_bps=alloc.read_bps,
            workers_target=None if alloc.workers is None else alloc.workers * self._ranks(job),
            workers_running=sum(r.num_workers for r in latest), achieved_sps=rates.achieved,
            max_sps_predicted=job.predicted[0] if job.predicted else None,
            max_sps_predicted_interval=(job.predicted[1], job.predicted[2]) if job.predicted else None,
            max_sps_measured=rates.max_throughput, gpu_idle_ratio=idle, data_wait_ratio=rates.data_wait_ratio,
            samples_total=sum(r.samples for r in latest),
            data_wait_seconds_total=sum(r.data_wait_s for r in latest),
            compute_seconds_total=sum(r.compute_s for r in latest),
            loader_cpu_seconds_total=sum(r.worker_cpu_s for r in latest),
            read_bytes_total=sum(r.read_bytes for r in latest),
            cpu_seconds_total=cpu_seconds,
        )

    # ------------------------------------------------------------------ helpers

    def _predict(self, job: Job) -> tuple[float, float, float] | None:
        if self._predictor is None or not job.features:
            return None
        try:
            return self._predictor(job.features, job.gpus)
        except Exception:  # a model bug must not refuse a job; it just starts unpredicted
            log.exception("throughput prediction failed for job %s (%s)", job.job_id, job.name)
            return None

    def _ranks_reporting(self, job: Job) -> int:
        now = self._clock()
        return sum(1 for window in job.ranks.values() if window and window[-1][0] >= now - self.window_s)

    def _ranks(self, job: Job) -> int:
        latest = [window[-1][1] for window in job.ranks.values() if window]
        return max([1, self._ranks_reporting(job), *(r.world_size for r in latest)])


def _first(*values: float | None) -> float | None:
    """The first value that is known (measured before recalled)."""
    return next((value for value in values if value is not None), None)
