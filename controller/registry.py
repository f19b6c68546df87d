"""The job table: who registered, what each rank reported, and what each control step
measured of each job.

Only the registry changes a :class:`Job`. Window maths lives in
:mod:`controller.measurements`, the prediction and recollection seams in
:mod:`controller.priors`, and what the policy, status and the state file see of a job
in :mod:`controller.projections`. The registry does no I/O: the control loop hands it
each job's CPU seconds (read once per step from the backend) in :meth:`Registry.measure`.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from adloader.protocol import JobSnapshot, Report
from controller.allocations import AllocationStore, JobAllocations
from controller.measurements import Measurement, RankWindow, measure
from controller.policies.base import JobAllocation, JobView
from controller.priors import JobFinishedHook, Prediction, Predictor, Recall, Recollection, predict
from controller.projections import persisted_of, snapshot_of, view_of
from controller.state import LearntModel, PersistedJob
from controller.unmanaged import DEFAULT_GRACE_S, managed_ranks, unmanaged_reason
from throughput_model.curves import LoadingCurveEstimator

log = logging.getLogger(__name__)


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
    predicted: Prediction | None = None
    """(M, low, high) from the predictor, until measurements take over."""
    remaining_samples: float | None = None
    total_samples: int | None = None
    """The job's length, as ranked: learnt from the node's history where it can be
    (controller/remaining.py), else as declared, else None (unknown)."""
    declared_samples: int | None = None
    """The length the job declared at registration (``adloader run --samples``)."""
    connected: bool = True
    """The launcher's registration connection is open."""
    exit_code: int | None = None
    """Set by End: the command has exited and the job no longer gets a share."""
    adopted: bool = False
    ranks: dict[int, RankWindow] = field(default_factory=dict)
    loading_curve: LoadingCurveEstimator = field(default_factory=LoadingCurveEstimator)
    """Fit of (cores, loading samples/s) from the job's windows (a recurring job's starts from its history)."""
    recollection: Recollection | None = None
    """What earlier runs of the same job measured (None: it has not run on this node)."""
    restored: LearntModel = field(default_factory=LearntModel)
    """What an earlier controller measured of the job (the state file): it stands in until
    this controller measures the same."""
    batches_counted: int = 0
    """Batches its ranks had reported in all at the last control step (the curve's evidence
    grows by the difference)."""
    cpu_samples: deque[tuple[float, float]] = field(default_factory=deque)
    """(monotonic time, CPU seconds of the job's whole group) over the window."""
    measurement: Measurement = field(default_factory=Measurement)
    """What the last control step measured (:meth:`Registry.measure`)."""
    watched_since: float = 0.0
    """Monotonic time this controller registered or adopted the job: its grace period starts there."""
    unmanaged_reason: str | None = None
    """Why no loader of the job is managed, as the last control step found (controller/unmanaged.py);
    None: managed, or still within its grace period."""
    pinned_workers: int | None = None
    """Workers, all ranks, an operator pinned the job to (``adloader workers``; controller/worker_pins.py);
    None: its policy decides them."""

    @property
    def ended(self) -> bool:
        return self.exit_code is not None

    @property
    def remaining(self) -> float | None:
        """Samples left: the job's length minus what the ranks reported, else what the
        state file said (None: unknown)."""
        if self.total_samples is None:
            return self.remaining_samples
        done = sum(window[-1][1].samples for window in self.ranks.values() if window)
        return float(max(0, self.total_samples - done))


class Registry:
    """Jobs by id, their reports, and each control step's measurement of them."""

    def __init__(
        self,
        *,
        window_s: float = 5.0,
        predictor: Predictor | None = None,
        on_job_finished: JobFinishedHook | None = None,
        recall: Recall | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        unmanaged_after_s: float = DEFAULT_GRACE_S,
    ) -> None:
        """``unmanaged_after_s``: the grace period after which a job none of whose loaders
        reports is unmanaged (controller/unmanaged.py)."""
        self.window_s = window_s
        self.unmanaged_after_s = unmanaged_after_s
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
        declared_samples: int | None = None,
    ) -> Job:
        now = self._wall_clock()
        job = Job(
            job_id=job_id, name=name, uid=uid, gpus=gpus, launcher_pid=launcher_pid, registered_at=now,
            arrival_s=now - self._started_wall, cgroup=cgroup, requested_workers=requested_workers,
            features=features, total_samples=declared_samples, declared_samples=declared_samples,
            watched_since=self._clock(),
        )
        self._remember(job)
        job.predicted = self._predict(job)
        self._jobs[job_id] = job
        return job

    def _remember(self, job: Job) -> None:
        """Give a job what the node's history says of it: its length (learnt before declared)
        and, for a recurring job, its loading cost, the prior of its loading curve until its own
        windows count."""
        recall = self._recall
        recollection = recall(job.name, job.features, job.declared_samples) if recall is not None else None
        if recollection is None:
            return
        job.recollection = recollection
        if recollection.samples:
            job.total_samples = int(recollection.samples)
        if recollection.cpu_s_per_sample:
            job.loading_curve = LoadingCurveEstimator(prior_cpu_s_per_sample=recollection.cpu_s_per_sample)
        log.info("job %s (%s): the node's history expects %s samples at %s ms of CPU each",
                 job.job_id, job.name, f"{job.total_samples:d}" if job.total_samples else "unknown",
                 f"{1000 * recollection.cpu_s_per_sample:.2f}" if recollection.cpu_s_per_sample else "unknown")

    def adopt(self, persisted: PersistedJob) -> Job:
        """Take over a job an earlier controller registered; its launcher's connection is gone.
        What that controller measured (M, p, b, the loading curve) comes back with it."""
        job = Job(
            job_id=persisted.job_id, name=persisted.name, uid=persisted.uid, gpus=persisted.gpus,
            launcher_pid=persisted.launcher_pid, registered_at=persisted.registered_at,
            arrival_s=persisted.registered_at - self._started_wall, cgroup=persisted.cgroup,
            requested_workers=persisted.requested_workers, features=persisted.features,
            remaining_samples=persisted.remaining_samples, connected=False, adopted=True,
            restored=persisted.model, watched_since=self._clock(), pinned_workers=persisted.pinned_workers,
            declared_samples=persisted.declared_samples,
        )
        job.loading_curve.resume(persisted.model.loading_observations)
        job.predicted = self._predict(job)
        self._jobs[job.job_id] = job
        return job

    def remove(self, job_id: str, *, pids: set[int], cpu_seconds: float,
               allocation: JobAllocations | None = None) -> JobSnapshot | None:
        """Forget the job; hand its final snapshot to the on_job_finished hook (job history).
        ``cpu_seconds``: its group's CPU time, read as the group goes."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return None
        # A last measurement: the reports since the last step count (a job's final report comes at its exit).
        job.measurement = measure(managed_ranks(job.ranks), self._clock(), self.window_s, cpu_seconds, deque())
        final = snapshot_of(job, allocation or JobAllocations(), pids)
        if self._on_job_finished is not None:
            try:
                self._on_job_finished(final, job.features, tuple(job.loading_curve.points()), job.exit_code,
                                      job.declared_samples)
            except Exception:  # a history bug must not stop the controller from freeing the job
                log.exception("on_job_finished hook failed for job %s", job_id)
        return final

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

    def disconnected(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.connected = False

    def end(self, job_id: str, exit_code: int) -> None:
        self._jobs[job_id].exit_code = exit_code

    # ------------------------------------------------------------------ the control step

    def measure(self, cpu_seconds: Mapping[str, float] | None = None) -> None:
        """Once per control step: each job's measurement (its rates over the window, its M,
        the cores it used), which every reader of this step then shares; each running job's
        window becomes a point of its loading curve, (cores used, samples/s delivered),
        whether or not the loader was the bottleneck (throughput_model.curves explains why).
        ``cpu_seconds``: each job's group CPU time (the backend's accounting), so the cores
        are what its group holds, which is what a quota limits (its loaders, and its training
        processes unless they were moved apart: :meth:`regrouped`); a job missing from it
        counts its loader workers' CPU. Only managed ranks' reports are a loader's counters; a
        job none of whose loaders reports past its grace period is found unmanaged here."""
        self.predict_pending()
        now = self._clock()
        for job in self:
            seconds = cpu_seconds.get(job.job_id) if cpu_seconds is not None else None
            reason = unmanaged_reason(job.ranks, now, job.watched_since, self.unmanaged_after_s)
            if reason != job.unmanaged_reason:
                if reason is None:
                    log.info("job %s (%s): a loader reports: managed", job.job_id, job.name)
                else:
                    log.info("job %s (%s) is unmanaged: %s", job.job_id, job.name, reason)
            job.unmanaged_reason = reason
            job.measurement = measure(managed_ranks(job.ranks), now, self.window_s, seconds, job.cpu_samples)
            achieved, cores = job.measurement.rates.achieved, job.measurement.cores_used
            batches = sum(report.batches for report in job.measurement.latest)
            new_batches, job.batches_counted = max(0, batches - job.batches_counted), batches
            if not job.ended and achieved is not None and cores is not None:
                self._observe(job, cores, achieved, new_batches)

    def regrouped(self, job_id: str) -> None:
        """A training process of the job left its CPU group for the first time
        (controller/training_processes.py): what the group used until then was that process's
        start-up too, so the group's CPU is read afresh from here and the loading curve restarts
        from its next window."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        job.cpu_samples.clear()
        job.loading_curve.restart()

    @staticmethod
    def _observe(job: Job, cores: float, achieved: float, new_batches: float) -> None:
        """One window of ``job``'s loading curve; a change of phase it reveals is logged, since
        the plans that follow rest on the new curve."""
        curve = job.loading_curve
        phases, cost_before = curve.phase_changes, curve.cpu_s_per_sample()
        curve.observe(cores, achieved, new_batches)
        if curve.phase_changes > phases and cost_before is not None and (cost := curve.cpu_s_per_sample()):
            log.info("job %s (%s) changed phase: a sample now costs %.2f ms of CPU, %.2f ms before; its "
                     "loading curve is relearnt from its last %d windows", job.job_id, job.name, 1e3 * cost,
                     1e3 * cost_before, curve.observations)

    def predict_pending(self) -> None:
        """Ask again for the jobs whose prediction was not ready at registration (the
        predictor loads its model off the event loop and says None meanwhile)."""
        for job in self:
            if job.predicted is None and job.features and not job.ended:
                job.predicted = self._predict(job)

    def views(self, applied: Mapping[str, JobAllocation]) -> list[JobView]:
        """What the policy sees: every job that has not ended, oldest first. ``applied``: the
        allocation in force per job (a job missing from it has none yet)."""
        return [view_of(job, applied.get(job.job_id, JobAllocation())) for job in self if not job.ended]

    def snapshot(self, job: Job, *, pids: set[int], allocation: JobAllocations | None = None) -> JobSnapshot:
        return snapshot_of(job, allocation or JobAllocations(), pids)

    def pin_workers(self, job_id: str, workers: int | None) -> bool:
        """Pin the job's workers (all ranks) or, with None, give them back to its policy; True if that changed."""
        job = self._jobs[job_id]
        changed, job.pinned_workers = job.pinned_workers != workers, workers
        return changed

    def pinned_workers(self) -> dict[str, int]:
        """Job id -> its pinned workers, for the jobs an operator pinned."""
        return {job.job_id: job.pinned_workers for job in self if job.pinned_workers is not None}

    def persisted(self, allocations: AllocationStore) -> dict[str, PersistedJob]:
        """What the state file keeps of every job."""
        return {job.job_id: persisted_of(job, allocations.get(job.job_id)) for job in self}

    def _predict(self, job: Job) -> Prediction | None:
        return predict(self._predictor, job.features, job.gpus, f"{job.job_id} ({job.name})")
