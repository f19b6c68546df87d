"""``adaptive``: the product. Gives each job the cores and read bandwidth that keep the
most GPUs busy, from each job's measured (or predicted) model.

Each period: jobs whose model is known (M and a loading curve, see
:func:`controller.policies.shares.measured_model`) go into the linear program of
:mod:`controller.policies.lp`, maximising Σ w_j·T_j/M_j; a job not yet measured
keeps an even share of the node (C/n cores, B/n bandwidth) until its first reports
arrive. Cores and bandwidth the program leaves over go to the jobs as headroom, so
nothing is held back idle. Workers follow cores.

The weight w_j is the job's GPUs g_j, halved when another job is clearly shorter per GPU
(its run's length per GPU, L/g, at the rate the whole node can give it, more than 1.5x the
other's; known when the jobs declare their length). A run's GPU busy is a GPU-weighted sum of
completion times (docs/policies.md): a job that finishes sooner stops holding its GPUs, so,
as Smith's rule orders such sums, the shortest job per GPU is served first (measured on
seeded random mix 11: 0.977x static before, 1.036x after). One step only: a chain of
halvings, one per job ahead, lost 7% to the oracle on simulated 128-core nodes with 16 jobs,
where one step lost nothing. By length, not by remaining time: remaining times drift as jobs
run, and each rank they crossed was a re-plan between arrivals and departures
(controller/policies/ranks.py).

Stability: jobs worth the same per core up to measurement noise are planned as equals
(:mod:`controller.policies.worth`), and the program keeps each group of them equally busy, so
they share evenly instead of trading the node back and forth; the finishing order is exact, so
it still orders jobs whose curves are pooled. The current allocation (``JobView.current``) is
kept unless a job arrived (or the previous policy set other kinds of limits), or the new one is
predicted to raise the objective by more than ``gain_threshold`` (10% by default: on a busy
two-core machine the models of two identical jobs differ by up to ±20%). At the step a job's
model becomes known (``JobView.newly_modelled``) the bar is ``first_plan_gain``
(2%): the even share it held was a placeholder, and waiting for 10% let measurement
noise decide when it got its plan, up to 7.6 s after its first report on the seeded
random mixes; a plan that gains nothing is still not worth a change (sixteen tiny jobs,
all satisfied either way, had their weights moved three times in two seconds). The same
lower bar holds at the step a job departs (``JobView.departure_step``): the jobs left were
planned beside it, and on seeded random mix 8 a 4-GPU job kept the one worker planned
beside the departed job for the rest of its run (0.98x static), its re-plan to two workers
predicted to gain less than 10%. Once the
node has settled (``settle_s`` after the last arrival or departure), a job whose
allocation changed less than ``min_change_interval_s`` ago keeps it unless the gain is
above ``urgent_gain`` (a job changing phase): under steady load no job's weight or
workers change more than once a minute.

A plan that would cut a job's predicted busy fraction below ``STARVED`` of what it has now is
checked once more, on what a run's GPU busy rewards: when every job's remaining samples are
known, the GPU-weighted completion times the current allocation and the plan each lead to
(:mod:`controller.policies.completion`). The plan is kept out when it finishes the jobs later
(simulated 2-core phase mixes, 240 seeds: 12 below 0.98x static before, 5 after; 2 with
ranks at the node's rate as well).
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, Mapping, Sequence

from controller.policies import lp
from controller.policies.base import READER_WORKERS_PER_CORE, Allocation, JobAllocation, JobView, NodeResources, \
    core_limit
from controller.policies.completion import weighted_completion_s
from controller.policies.outgrown import followed, outgrowth
from controller.policies.ranks import at_node_rate, ranks_behind, run_lengths, unknown_as_longest
from controller.policies.rules import AdaptiveRules
from controller.policies.worth import alike_curves, counted_batches, pool_equal_worth, young_curve
from controller.policies.shares import (
    SATISFIED,
    SATISFIED_WEIGHT,
    JobModel,
    allocations,
    contended_bandwidth,
    floors,
    idle_reader_workers,
    managed_bandwidth,
    measured_model,
    model_of,
    predicted_busy,
    predicted_objective,
    reserve_of,
    spread,
    workers_follow_reads,
    workers_for_span,
)

log = logging.getLogger(__name__)

FINISH_FACTOR = 2.0
"""How many times the busy fraction of a job no other job is clearly shorter than, per GPU,
outweighs that of one behind (see the module docstring). One step, not one per rank."""

EQUALS_APART = 0.3
"""Busy fractions further apart than this, within a group of jobs worth the same that a job
has just outgrown its model into, are evened out whatever the gain (``_evens_outgrown``)."""

UNMANAGED_OFF = 1.5
"""An unmanaged job whose current CPU weight or quota is this many times what its measured use
reserves now, or this many times less, is planned anew whatever the reporting jobs gain. Found
unmanaged before its use was measured, it held an even share for good: the reporting job's plan
gained too little to pass the bar (tests/test_unmanaged.py failed 9 of 19 runs)."""

STARVED = 0.5
"""A plan that cuts a job's predicted busy fraction below this fraction of what the current
allocation gives it is checked on completion times before it is made (the module docstring)."""


KEEPS_UP = "it keeps up with its GPUs"
"""Why a reader's workers were cut, as logged by the idle-reader rule."""


class AdaptivePolicy:
    name = "adaptive"

    def __init__(
        self,
        gain_threshold: float = 0.1,
        workers_per_core: float = 1.0,
        reader_workers_per_core: float = READER_WORKERS_PER_CORE,
        min_change_interval_s: float = 60.0,
        settle_s: float = 10.0,
        urgent_gain: float = 0.3,
        first_plan_gain: float = 0.02,
        rules: AdaptiveRules | None = None,
    ) -> None:
        self.rules = AdaptiveRules() if rules is None else rules
        """Which rules around the program are on (all, but in an ablation: controller/policies/rules.py)."""
        self.gain_threshold = gain_threshold
        self.first_plan_gain = first_plan_gain
        self.min_change_interval_s = min_change_interval_s
        self.settle_s = settle_s
        self.urgent_gain = urgent_gain
        self.workers_per_core = workers_per_core
        self.reader_workers_per_core = reader_workers_per_core
        self._held_back: tuple[str, ...] = ()
        """The jobs the last completion check kept a plan from starving (so its reason is logged
        once at INFO, not at every step it holds)."""
        self._outgrown: frozenset[str] = frozenset()
        """The jobs the last step planned dearer than their curves (so each is logged once at INFO)."""

    def weights(self, node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel]
                ) -> dict[str, float]:
        """Objective weight of each modelled job's busy fraction: its worth weight times its
        finishing-order factor (:meth:`weighing`)."""
        return _times(*self.weighing(node, jobs, models))

    def weighing(self, node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel]
                 ) -> tuple[dict[str, float], dict[str, float]]:
        """For each modelled job, (worth weight, finishing-order factor). The worth weight is its
        GPUs (a job without a GPU counts as one device); the factor is 1, or 1/``FINISH_FACTOR``
        when another job is clearly ahead of it in run length per GPU, L/g, at the rate the
        whole node can give it (:mod:`controller.policies.ranks`; a job whose length is unknown
        counts the longest known L; jobs of one shape are given one curve first, so that their
        counting noise does not rank them apart). The two are kept apart because only the
        measured curves are noisy: jobs are pooled by their worth up to that noise, and the
        exact factor then orders them."""
        gpus = {job.job_id: float(max(1, job.gpus)) for job in jobs if job.job_id in models}
        if not self.rules.finishing_order:
            return gpus, dict.fromkeys(gpus, 1.0)
        lengths = run_lengths(jobs, models)
        if self.rules.ranks_at_node_rate:
            curves, alike = alike_curves({job_id: models[job_id] for job_id in gpus}, gpus, counted_batches(jobs),
                                         widest=FINISH_FACTOR)
            lengths = at_node_rate(node, jobs, curves, lengths, alike)
        if not lengths:
            return gpus, dict.fromkeys(gpus, 1.0)
        per_gpu = {job_id: length / gpus[job_id] for job_id, length in unknown_as_longest(lengths, gpus).items()}
        behind = ranks_behind(per_gpu)
        return gpus, {job_id: 1.0 / FINISH_FACTOR if behind[job_id] else 1.0 for job_id in gpus}

    def allocate(self, node: NodeResources, jobs: Sequence[JobView]) -> Allocation:
        if not jobs:
            return {}
        jobs = sorted(jobs, key=lambda j: j.job_id)
        model_from = measured_model if self.rules.curve_only else model_of
        measured, outgrown = self._followed(
            {job.job_id: model for job in jobs if not job.unmanaged and (model := model_from(job)) is not None},
            jobs)
        worth, order = self.weighing(node, jobs, measured)
        weights = _times(worth, order)
        models, equals = pool_equal_worth(measured, worth, weights, counted_batches(jobs), widest=FINISH_FACTOR) \
            if self.rules.equal_worth else (measured, [])
        target = self._target(node, jobs, models, weights, equals)
        if self._keep_current(node, jobs, models, weights, target, equals, outgrown):
            return self._kept(node, jobs, outgrown)
        self._held_back = ()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: models behind the new allocation: %s", self.name, _planned(jobs, models, weights, target))
        if self.rules.kept_beside_newcomers:
            target = _workers_kept_beside_newcomers(node, jobs, models, target, self.workers_per_core)
        target, cut = self._without_idle_workers(node, jobs, target)
        self._log_cuts(cut, target, KEEPS_UP)
        return target

    def _target(
        self,
        node: NodeResources,
        jobs: Sequence[JobView],
        models: Mapping[str, JobModel],
        weights: Mapping[str, float],
        equals: Sequence[Sequence[str]],
    ) -> Allocation:
        """The plan: the program's cores and bandwidth for the modelled jobs (``equals``, the
        groups planned as worth the same, kept equally busy), an even placeholder for the rest."""
        budget = contended_bandwidth(node, jobs, models) if self.rules.contended_reads else managed_bandwidth(node)
        manage_io = budget is not None
        bandwidth = budget or 0.0
        n = len(jobs)
        core_floor, io_floor = floors(node, n)
        unknown = [job for job in jobs if job.job_id not in models]
        reserved_cores = {job.job_id: reserve_of(node, job, n) for job in unknown}
        reserved_io = {job.job_id: bandwidth / n for job in unknown}
        demands = [
            lp.JobDemand(
                job_id=job.job_id,
                weight=weights[job.job_id],
                max_throughput=models[job.job_id].max_throughput,
                lines=models[job.job_id].lines,
                bytes_per_sample=models[job.job_id].bytes_per_sample,
                min_cores=min(core_floor, core_limit(node, job)),
                max_cores=core_limit(node, job),
                min_read_bps=io_floor,
            )
            for job in jobs
            if job.job_id in models
        ]
        free_cores = node.cores - sum(reserved_cores.values())
        free_io = bandwidth - sum(reserved_io.values())
        solution = lp.solve(demands, free_cores, free_io if manage_io else None, equals)
        read_bps = None
        if manage_io:
            read_bps = spread(bandwidth, {**reserved_io, **solution.read_bps}, floor=io_floor)
        satisfied = frozenset(job_id for job_id, busy in solution.busy.items() if busy >= SATISFIED)
        return allocations(
            node, jobs, {**reserved_cores, **solution.cores}, read_bps, satisfied, workers_follow_reads(node, models),
            self.workers_per_core, self.reader_workers_per_core,
        )

    def _kept(self, node: NodeResources, jobs: Sequence[JobView], outgrown: frozenset[str]) -> Allocation:
        """The current allocation, kept, with its readers' idle workers shed
        (:func:`_without_idle_workers`) where the once-a-minute rule allows a change."""
        kept = {job.job_id: job.current for job in jobs}
        shed, cut = self._without_idle_workers(node, jobs, kept)
        if not cut or self._too_soon(jobs, shed, outgrown):
            return kept
        self._log_cuts(cut, shed, KEEPS_UP)
        return shed

    def _without_idle_workers(self, node: NodeResources, jobs: Sequence[JobView], allocation: Allocation
                              ) -> tuple[Allocation, tuple[JobView, ...]]:
        """:func:`_without_idle_workers` where that rule is on; else ``allocation`` and no job cut."""
        return _without_idle_workers(node, jobs, allocation) if self.rules.idle_workers else (allocation, ())

    def _log_cuts(self, cut: Sequence[JobView], allocation: Allocation, why: str) -> None:
        """Log once, at INFO, each reader whose workers ``allocation`` cuts below what it holds, and ``why``."""
        for job in cut:
            workers = allocation[job.job_id].workers
            if job.current.workers is not None and workers is not None and workers < job.current.workers:
                log.info("%s: %s loads %.2f batches at once a rank: %d workers, not %d (%s)", self.name, job.name,
                         (job.loads_in_flight or 0.0) / max(1, job.ranks), workers, job.current.workers, why)

    def _keep_current(
        self,
        node: NodeResources,
        jobs: Sequence[JobView],
        models: Mapping[str, JobModel],
        weights: Mapping[str, float],
        target: Allocation,
        equals: Sequence[Sequence[str]],
        outgrown: frozenset[str],
    ) -> bool:
        """True when every job has an allocation from this kind of policy and the target is
        not predicted to beat the current one by more than the threshold (``outgrown``: the jobs
        planned dearer than their curves this step)."""
        current = {job.job_id: job.current for job in jobs}
        if any((job.current.workers is None) != job.unmanaged or _unmanaged_off_its_use(job, target[job.job_id])
               or (job.current.cpu_weight is None) != (target[job.job_id].cpu_weight is None)
               or (job.current.cores is None) != (target[job.job_id].cores is None) for job in jobs):
            # A job arrived or was just found unmanaged (it held a newcomer's placeholder), an unmanaged
            # job holds far from what its use now reserves (no gain of the reporting jobs' would move
            # it), the previous policy set other kinds of limits, or weights stopped acting.
            return False
        if any((a.read_bps is None) != (target[job_id].read_bps is None) for job_id, a in current.items()):
            return False  # reads became contended (throttles go on) or stopped being (they come off)
        now, gain = _predicted_gain(node, jobs, models, weights, current, target)
        anew = _plan_anew(jobs)
        threshold = 0.0 if not self.rules.hysteresis else \
            self.first_plan_gain if anew and self.rules.first_plan_bar else self.gain_threshold
        small_gain = gain <= now * threshold + 1e-9
        if small_gain and anew and self.rules.newcomers_within_noise:
            if within_noise := _newcomers_satisfied_within_noise(node, jobs, models, weights, current, target,
                                                                  threshold):
                log.info("%s: makes the first plan of %s though it gains only %+.1f%% of predicted rate: the "
                         "placeholder satisfies %s only within the counting noise of %s young curve", self.name,
                         ", ".join(within_noise), 100 * gain / max(now, 1e-12),
                         *(("them", "each one's") if len(within_noise) > 1 else ("it", "its")))
                small_gain = False
        evens = self.rules.evens_outgrown and _evens_outgrown(node, jobs, models, current, target, equals, outgrown)
        if small_gain and not evens:
            if anew:
                log.debug("%s: keeps the current allocation at a first plan or departure: the plan gains %+.1f%% "
                          "of predicted rate, under the %.0f%% bar; the plan: %s", self.name,
                          100 * gain / max(now, 1e-12), 100 * threshold, _planned(jobs, models, weights, target))
            return True
        if self._too_soon(jobs, target, outgrown) and gain <= now * self.urgent_gain + 1e-9:
            return True
        return self._finishes_later(node, jobs, models, current, target, gain / max(now, 1e-12), equals,
                                    cut_below=1.0 if small_gain else STARVED)

    def _finishes_later(
        self,
        node: NodeResources,
        jobs: Sequence[JobView],
        models: Mapping[str, JobModel],
        current: Allocation,
        target: Allocation,
        rate_gain: float,
        equals: Sequence[Sequence[str]],
        cut_below: float = STARVED,
    ) -> bool:
        """True when the target cuts a job's predicted busy below ``cut_below`` of what it has
        now (``STARVED``; any cut for a plan that only evens out an outgrown group, which gains
        nothing by itself) and is predicted to finish the jobs later, GPU-weighted, than keeping
        the current allocation until the next departure (each course planned anew after every
        departure). False when a job's model was just learned (what it holds is a placeholder)
        or a job's remaining samples are not known. Runs only where a plan passed the gain
        thresholds, so the busy fractions are predicted here, apart from the objective's."""
        if not self.rules.completion_check or any(job.newly_modelled for job in jobs):
            return False
        before = predicted_busy(node, jobs, models, current)
        after = predicted_busy(node, jobs, models, target)
        starved = tuple(job.name for job in jobs if job.job_id in after
                        and after[job.job_id] < cut_below * before[job.job_id] * (1 - 1e-9))
        if not starved:
            return False

        def replan(left: Sequence[JobView]) -> Allocation:
            return self._target(node, left, models, self.weights(node, left, models), equals)

        kept = weighted_completion_s(node, jobs, models, current, replan)
        planned = weighted_completion_s(node, jobs, models, target, replan)
        if kept is None or planned is None or planned <= kept:
            return False
        log.log(
            logging.DEBUG if starved == self._held_back else logging.INFO,
            "%s: keeps the current allocation: the plan would %s %s for %+.0f%% of predicted rate, "
            "but finish the jobs %.0f%% later, GPU-weighted (%.0f against %.0f GPU-seconds)",
            self.name, "starve" if cut_below <= STARVED else "cut", ", ".join(starved), 100 * rate_gain,
            100 * (planned / kept - 1), planned, kept,
        )
        self._held_back = starved
        return True

    def _followed(self, models: Mapping[str, JobModel], jobs: Sequence[JobView]
                  ) -> tuple[dict[str, JobModel], frozenset[str]]:
        """Each model, made dearer where its job has outgrown it (controller/policies/outgrown.py),
        and the jobs that have; logs each job newly seen outgrowing its model once at INFO."""
        if not self.rules.outgrown_models:
            return dict(models), frozenset()
        result: dict[str, JobModel] = {}
        for job in jobs:
            if (model := models.get(job.job_id)) is None:
                continue
            result[job.job_id] = followed(job, model)
            if result[job.job_id] is not model and job.job_id not in self._outgrown:
                log.info("%s: %s used %.2f cores for %.0f samples/s, where its loading curve plans %.2f: "
                         "planned %.2fx dearer until its curve follows", self.name, job.name, job.cores_used,
                         job.achieved, model.cores_for(job.achieved or 0.0), outgrowth(job, model))
        self._outgrown = frozenset(job_id for job_id, model in result.items() if model is not models[job_id])
        return result, self._outgrown

    def _too_soon(self, jobs: Sequence[JobView], target: Allocation, outgrown: frozenset[str]) -> bool:
        """True when the node has settled and a job the target would change got its current
        allocation less than ``min_change_interval_s`` ago. The node has not settled while
        ``settle_s`` has not passed since the last arrival or departure, nor while a job's
        loading curve is young (fewer than MATURE_CURVE_WINDOWS windows): a job whose loader
        first reports after the settle time (a slow start: 10 s for one of jct_lengths' jobs)
        gets its first plan, and the others make room for it, on the usual threshold, not
        only on an urgent gain."""
        if not self.rules.once_a_minute:
            return False
        if any(job.since_event_s is None or job.since_event_s < self.settle_s or young_curve(job) for job in jobs):
            return False
        if outgrown:
            return False  # a job's load has just changed: the node is not under steady load
        return any(
            job.allocation_age_s is not None and job.allocation_age_s < self.min_change_interval_s
            for job in jobs
            if _limits(job.current) != _limits(target[job.job_id])
        )


def _planned(jobs: Sequence[JobView], models: Mapping[str, JobModel], weights: Mapping[str, float],
             target: Allocation) -> str:
    """Each job's model and what ``target`` gives it, for the DEBUG log: what a plan rested on,
    so that a trace can tell a changed rank from a changed curve."""
    return "; ".join(
        f"{job.name} w={weights[job.job_id]:.3g} M={m.max_throughput:.0f}/s "
        f"needs {m.cores_to_saturate():.2f} cores ({job.curve_windows} windows), "
        f"weight {target[job.job_id].cpu_weight} workers {target[job.job_id].workers}"
        if (m := models.get(job.job_id)) else f"{job.name}: not measured yet"
        for job in jobs
    )


def _times(worth: Mapping[str, float], order: Mapping[str, float]) -> dict[str, float]:
    """Each job's weight: its worth weight times its finishing-order factor."""
    return {job_id: weight * order[job_id] for job_id, weight in worth.items()}


def _evens_outgrown(
    node: NodeResources,
    jobs: Sequence[JobView],
    models: Mapping[str, JobModel],
    current: Allocation,
    target: Allocation,
    equals: Sequence[Sequence[str]],
    outgrown: frozenset[str],
) -> bool:
    """True when a job has outgrown its model (``outgrown``, controller/policies/outgrown.py)
    into a group of jobs worth the same, which the current allocation keeps clearly apart in busy
    fraction (by more than ``EQUALS_APART``) and the target evens out. Worth the same
    per core, the two allocations score alike, so the gain threshold alone would keep the
    job that got dearer on the satisfied weight it held: on the simulated crossing pairs it
    took 1.95 of 2 cores while its neighbour, cheaper now but starved, counted too few
    batches for its curve to follow."""
    groups = [group for group in equals if outgrown & set(group)]
    if not groups:
        return False
    before = predicted_busy(node, jobs, models, current)
    after = predicted_busy(node, jobs, models, target)

    def spread_of(busy: Mapping[str, float], group: Sequence[str]) -> float:
        values = [busy[job_id] for job_id in group if job_id in busy]
        return max(values) - min(values) if values else 0.0

    return any(spread_of(before, group) > EQUALS_APART and spread_of(after, group) < spread_of(before, group) / 2
               for group in groups)


def _workers_kept_beside_newcomers(node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel],
                                   target: Allocation, workers_per_core: float) -> Allocation:
    """``target``, except that while a job is not yet measured, no measured job bound by its
    cores gets fewer workers than it holds, up to those its model needs at full speed. The
    newcomer's even share (C/n cores) is a placeholder, and CPU weights already give it that
    share whenever it asks (they are work-conserving); workers are not: cut to what the
    placeholder leaves, a job cannot use the cores the newcomer does not. On seeded random mix
    16 (2026-11-27) a 2-GPU job needing 1.65 of 2 cores was cut from two workers a rank to one
    for the 6 s two newcomers took to be measured, though they needed 0.3 cores together:
    0.52-0.75 busy against 0.93 under ``static``, and the mix lost to it (0.974x). Kept beyond
    the model's need, the workers only crowd the cores (SIMULATED: 0.5-1% off the 8-GPU rows).
    A reader's workers follow the reads its throttle allows. The first plan on every model
    sets the workers the models call for; memory still caps them (shares.workers_for_span)."""
    if all(job.job_id in models or job.unmanaged for job in jobs):  # an unmanaged job is never measured
        return target
    readers = workers_follow_reads(node, models)
    result = dict(target)
    for job in jobs:
        held, planned = job.current.workers, target[job.job_id].workers
        if (model := models.get(job.job_id)) is None or job.job_id in readers or held is None or planned is None:
            continue
        kept = min(held, workers_for_span(node, job, model.cores_to_saturate(), workers_per_core))
        if kept > planned:
            result[job.job_id] = replace(target[job.job_id], workers=kept)
            log.debug("%s keeps %d workers a rank beside a newcomer not yet measured (placeholder plan: %d)",
                      job.name, kept, planned)
    return result


def _without_idle_workers(node: NodeResources, jobs: Sequence[JobView], allocation: Allocation
                          ) -> tuple[Allocation, tuple[JobView, ...]]:
    """``allocation``, except that a reader keeping up with its GPUs on workers that mostly wait
    gets only the workers its timed loading needs (shares.idle_reader_workers). The models do
    not see those workers, so a plan cut to them gains nothing and would never pass the gain
    threshold; but each joins in at every epoch start, its first reads sharing the device. On
    seeded random mix 6 a 4-GPU reader loaded 0.18-0.26 batches at once on the three workers of
    its placeholder share, and kept them through its first 11 s alone. The cut needs no model
    (that reader's first plan came 4.5-7.5 s after its first report, a settle past the 5 s
    goal), only the job's measured M and timed loading. Also returns the jobs it cut."""
    bandwidth = managed_bandwidth(node)
    return _with_fewer_workers(jobs, allocation, lambda job: idle_reader_workers(job, bandwidth))


def _with_fewer_workers(jobs: Sequence[JobView], allocation: Allocation,
                        workers_of: Callable[[JobView], int | None]) -> tuple[Allocation, tuple[JobView, ...]]:
    """``allocation`` with each job given ``workers_of(job)`` workers where that is fewer than
    ``allocation`` gives it (None: no count for it), and the jobs so cut."""
    result = dict(allocation)
    cut: list[JobView] = []
    for job in jobs:
        given, fewer = allocation[job.job_id].workers, workers_of(job)
        if given is not None and fewer is not None and fewer < given:
            result[job.job_id] = replace(allocation[job.job_id], workers=fewer)
            cut.append(job)
    return result, tuple(cut)


def _newcomers_satisfied_within_noise(node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel],
                                      weights: Mapping[str, float], current: Allocation, target: Allocation,
                                      threshold: float) -> tuple[str, ...]:
    """The names of the jobs whose model is new and young (fewer than MATURE_CURVE_WINDOWS
    windows) and to which ``target`` gives the satisfied weight their placeholder lacks, where
    ``target`` beats ``current`` by more than ``threshold`` once those jobs' curves are made
    dearer by one standard deviation of their counting noise; () otherwise.

    A first plan held for gaining nothing is held on the newcomer's first few windows: where
    the placeholder satisfies it only within that noise, its maturing curve tips the balance a
    few seconds later, and the plan is made then, as a change of its own. On seeded random mix
    2 a 4-GPU newcomer needing 0.65 cores by 3 windows, 0.66 by its placeholder weight, had its
    first plan held and made 2.6 s later at 0.78 (8 windows): 5.0-5.5 s after the departure
    before it in two of four repeats. Only a plan that satisfies the newcomer: that weight stays
    right if its curve turns out cheaper. Making every young curve dearer made marginal plans of
    every kind at the first step of the simulated 2-core phase mixes, and one (4 jobs, seed 14)
    starved a 1-GPU job it had held fed: 1.070x -> 0.980x ``static``."""
    dearer = {
        job.job_id: models[job.job_id].dearer(math.exp(1.0 / math.sqrt(max(1.0, job.curve_batches))))
        for job in jobs
        if job.newly_modelled and job.job_id in models and young_curve(job) and job.curve_batches is not None
        and _satisfied_weight(target[job.job_id]) and not _satisfied_weight(current[job.job_id])
    }
    if not dearer:
        return ()
    now, gain = _predicted_gain(node, jobs, {**models, **dearer}, weights, current, target)
    if gain <= now * threshold + 1e-9:
        return ()
    return tuple(job.name for job in jobs if job.job_id in dearer)


def _predicted_gain(node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel],
                    weights: Mapping[str, float], current: Allocation, target: Allocation) -> tuple[float, float]:
    """The objective ``models`` predict for ``current``, and how much more they predict for ``target``."""
    now = predicted_objective(node, jobs, models, weights, current)
    return now, predicted_objective(node, jobs, models, weights, target) - now


def _satisfied_weight(allocation: JobAllocation) -> bool:
    """True when ``allocation`` gives its job the CPU weight of a job the plan satisfies."""
    return allocation.cpu_weight is not None and allocation.cpu_weight >= SATISFIED_WEIGHT


def _unmanaged_off_its_use(job: JobView, planned: JobAllocation) -> bool:
    """True when ``job`` is unmanaged, its use is measured, and what it holds (its quota, else its
    weight) is UNMANAGED_OFF times what the plan reserves for that use, or that many times less."""
    if not job.unmanaged or job.cores_used is None:
        return False
    held, reserved = (job.current.cores, planned.cores) if planned.cores is not None else \
        (job.current.cpu_weight, planned.cpu_weight)
    if not held or not reserved:
        return False
    return max(held, reserved) > UNMANAGED_OFF * min(held, reserved)


def _plan_anew(jobs: Sequence[JobView]) -> bool:
    """True at a step where what the jobs hold was planned for another node: a job's model has
    just become known (its even share was a placeholder), or a job has just left."""
    return any(job.newly_modelled or job.departure_step for job in jobs)


def _limits(allocation: JobAllocation) -> tuple[float | None, int | None, int | None]:
    """What the once-a-minute rule counts as a change: cores, CPU weight and workers."""
    return allocation.cores, allocation.cpu_weight, allocation.workers

