"""The safety net: a plan that made a job clearly slower is taken back.

A policy plans from models, and a model can be wrong (a curve learnt at other loads,
a job whose loading the plan misjudged). An operator leaves adloader on only if it is
never worse than leaving the node alone, so the loop checks every plan change that
cut a job's limits against what the job then measured: when the job's throughput under
the new allocation stays clearly below what it had just before (``drop``, on
``confirm_steps`` consecutive steps once its measurement window covers only the new
allocation), the job gets its previous allocation back, the reason is logged, and the
policy is not allowed to cut it below that allocation for ``hold_s`` (it may give more:
a job held at what it had beside jobs that have since left gets their cores and workers;
held exactly, one kept a single worker alone on the node in the simulator).

"Clearly" is also beyond counting noise: a job's rate is counted in whole batches over the
registry's window, so a job the plan meant to leave a batch or two a window measures none
in many windows by chance. A drop counts only when the batches missing from the window
exceed ``noise_z`` standard deviations of a Poisson count of the batches expected (on
2-core simulated mixes, a job planned to deliver 4 samples/s in batches of 32 was given back
the cores of a 4-GPU job, measuring 0, and held there for the rest of its run).

"What it had before" is what the plan meant to leave it: a plan on an oversubscribed
node may slow one job on purpose, to feed a job whose GPUs gain more from the same
cores. When the loop hands over the node, the job's own model (its measured M and
loading curve, controller.policies.shares) predicts its rate under the new allocation,
and the job is judged against the lower of that and its rate before; a plan that keeps
its word is left alone, one whose model was wrong is taken back. Judged against its rate
before alone, every trade the policy made on purpose was undone (the simulator's
crossing-phase mixes: 7 to 16 give-backs a mix, each holding a stale allocation).

Only changes the policy made on its own (gain-driven) are judged: after an arrival a job
is meant to give up cores to the newcomer, and after a departure nothing was cut. And only
cuts larger than ``drop``: a job's CPU share, workers or reads cut by less cannot by themselves
make it that much slower, and giving them back restores nothing that the jobs raised beside it
took (seeded random mix 19, measured: a reader's weight went 1030 -> 1023 as three jobs were
raised to ~1000, its rate fell 20% under the new neighbours, and the "give-back" to 1030, a
change that changed nothing, came 11.5 s after the last arrival, past the 5 s settle goal).

A job that changes phase under a cut is not the plan's doing: when its loading cost per
sample (CPU seconds, ``JobView.cpu_s_per_sample``) has grown since the cut, what it had
before is scaled down by as much, since the same cores now make fewer samples. Judged on
samples/s alone, the net took every job that got dearer soon after a cut for a bad plan
(20 give-backs on the simulator's crossing-phase mixes, each holding a stale allocation
for ``hold_s``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from controller.policies.base import JobAllocation, JobView, NodeResources
from controller.policies.outgrown import followed
from controller.policies.shares import model_of, predicted_busy

log = logging.getLogger(__name__)


@dataclass
class _Watch:
    before: JobAllocation
    after: JobAllocation
    rate_before: float
    """Samples/s the job is held to: its rate before the cut, or less where the plan meant it."""
    cost_before: float | None
    """The job's CPU seconds per sample when it was cut (None: not measured)."""
    changed_at: float
    low_steps: int = 0

    def expected(self, cost_now: float | None) -> float:
        """What the job would deliver now with what it had before the cut: its rate then,
        scaled down by how much dearer each sample has become since (never up: a job that
        became cheaper is held to its old rate)."""
        if self.cost_before is None or cost_now is None or not (self.cost_before > 0 and cost_now > 0):
            return self.rate_before
        return self.rate_before * min(1.0, self.cost_before / cost_now)


@dataclass(frozen=True)
class Revert:
    """One allocation taken back: the job, its throughput before and after, samples/s."""

    job_id: str
    rate_before: float
    rate_after: float
    allocation: JobAllocation


class SafetyNet:
    """Watches plan changes that cut a job's limits, and undoes those that made it slower."""

    def __init__(
        self,
        *,
        drop: float = 0.15,
        settle_s: float = 6.0,
        judge_s: float = 30.0,
        confirm_steps: int = 3,
        hold_s: float = 300.0,
        window_s: float = 5.0,
        noise_z: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        """``settle_s``: wait this long after a change (the registry's measurement window and
        a step) before judging; ``judge_s``: stop watching this long after it; ``window_s``:
        the registry's measurement window, over which a job's batches are counted; ``enabled``
        False: review every plan as wanted (the ablation's ``--without safety_net``)."""
        self.enabled = enabled
        self.drop = drop
        self.window_s = window_s
        self.noise_z = noise_z
        self.settle_s = settle_s
        self.judge_s = judge_s
        self.confirm_steps = confirm_steps
        self.hold_s = hold_s
        self._clock = clock
        self._watches: dict[str, _Watch] = {}
        self._held: dict[str, tuple[JobAllocation, float]] = {}
        self.reverts = 0

    def review(
        self, views: Sequence[JobView], wanted: Mapping[str, JobAllocation], gain_driven: bool,
        node: NodeResources | None = None,
    ) -> tuple[dict[str, JobAllocation], list[Revert]]:
        """The allocation to apply: ``wanted`` with held jobs kept at what they were given back,
        and jobs the last cut made clearly slower given back their previous allocation.
        ``gain_driven``: the policy acted on new measurements alone (no arrival, departure,
        adoption or policy change since the last step). ``node``: the resources shared, for
        the rate each cut job's model predicts under ``wanted`` (None: judged against its rate
        before only)."""
        if not self.enabled:
            return dict(wanted), []
        now = self._clock()
        live = {view.job_id for view in views}
        self._forget(live, now)
        result = dict(wanted)
        reverts: list[Revert] = []
        planned: Mapping[str, float] | None = None
        for view in views:
            job_id = view.job_id
            held = self._held.get(job_id)
            if held is not None:
                result[job_id] = at_least(held[0], result.get(job_id, held[0]))
                continue
            watch = self._watches.get(job_id)
            if watch is not None and view.current == watch.after:
                revert = self._judge(view, watch, now)
                if revert is not None:
                    reverts.append(revert)
                    result[job_id] = revert.allocation
                    self._held[job_id] = (revert.allocation, now + self.hold_s)
                    del self._watches[job_id]
                    continue
            new = result.get(job_id)
            if (gain_driven and new is not None and new != view.current and _cuts(view.current, new, self.drop)
                    and view.achieved is not None and view.achieved > 0):
                if planned is None:
                    planned = _planned_rates(node, views, result) if node is not None else {}
                self._watches[job_id] = _Watch(before=view.current, after=new,
                                               rate_before=min(view.achieved, planned.get(job_id, view.achieved)),
                                               cost_before=view.cpu_s_per_sample, changed_at=now)
            elif new is not None and new != view.current:
                self._watches.pop(job_id, None)  # a new allocation for another reason: nothing to judge
        self.reverts += len(reverts)
        return result, reverts

    def _judge(self, view: JobView, watch: _Watch, now: float) -> Revert | None:
        age = now - watch.changed_at
        if age < self.settle_s or view.achieved is None:
            return None
        if age > self.judge_s:
            del self._watches[view.job_id]
            return None
        expected = watch.expected(view.cpu_s_per_sample)
        if (view.achieved >= (1.0 - self.drop) * expected
                or not self._beyond_counting_noise(view.achieved, expected, view.batch_size)):
            watch.low_steps = 0
            return None
        watch.low_steps += 1
        if watch.low_steps < self.confirm_steps:
            return None
        dearer = f", {expected:.0f} at its loading cost now" if expected < watch.rate_before else ""
        log.warning(
            "job %s (%s): %.0f samples/s under its new allocation against %.0f before the plan cut it%s "
            "(%.0f%% less, more than %.0f%%): giving back its previous allocation and holding it for %.0f s",
            view.job_id, view.name, view.achieved, watch.rate_before, dearer,
            100 * (1 - view.achieved / expected), 100 * self.drop, self.hold_s,
        )
        return Revert(job_id=view.job_id, rate_before=watch.rate_before, rate_after=view.achieved,
                      allocation=watch.before)

    def _beyond_counting_noise(self, achieved: float, expected: float, batch_size: int | None) -> bool:
        """True when the batches ``achieved`` samples/s make in a window fall short of those
        ``expected`` samples/s make by more than ``noise_z`` standard deviations of their count
        (always, when the job's batch size is not known)."""
        if not batch_size:
            return True
        batches_per_sample = self.window_s / batch_size
        expected_batches = expected * batches_per_sample
        return expected_batches - achieved * batches_per_sample > self.noise_z * math.sqrt(expected_batches)

    def _forget(self, live: set[str], now: float) -> None:
        for job_id in [j for j in self._watches if j not in live]:
            del self._watches[job_id]
        for job_id in [j for j, (_, until) in self._held.items() if j not in live or until <= now]:
            del self._held[job_id]


def _planned_rates(node: NodeResources, views: Sequence[JobView], allocation: Mapping[str, JobAllocation]
                   ) -> dict[str, float]:
    """Samples/s each modelled job's model predicts under ``allocation`` (jobs the allocation
    does not name keep what they have); a job that has outgrown its model is judged by the
    dearer model its plan was made with (controller/policies/outgrown.py)."""
    full = {view.job_id: allocation.get(view.job_id, view.current) for view in views}
    models = {view.job_id: followed(view, model) for view in views if (model := model_of(view)) is not None}
    return {job_id: busy * models[job_id].max_throughput
            for job_id, busy in predicted_busy(node, views, models, full).items()}


UNLIMITED_WHEN_NONE = ("cores", "cpus", "read_bps")
"""Fields whose None means no limit; a None weight or worker count means the default, which
cannot be compared with a number, so the floor's value is kept there."""


def at_least(floor: JobAllocation, wanted: JobAllocation) -> JobAllocation:
    """``wanted``, raised field by field to ``floor`` where it gives less."""
    def more_or_floor(name: str) -> object:
        low, want = getattr(floor, name), getattr(wanted, name)
        if low is None or want is None:
            return None if name in UNLIMITED_WHEN_NONE else low
        if name == "cpus":
            return want if set(want) >= set(low) else low
        return max(low, want)
    return JobAllocation(**{f.name: more_or_floor(f.name) for f in dataclasses.fields(JobAllocation)})


def _cuts(before: JobAllocation, after: JobAllocation, by: float) -> bool:
    """True when ``after`` gives more than ``by`` (a fraction) less of something than ``before``:
    cores, weight, workers, reads."""
    for field_ in ("cores", "cpu_weight", "workers", "read_bps"):
        old, new = getattr(before, field_), getattr(after, field_)
        if new is not None and (old is None or new < old * (1.0 - by)):
            return True
    return False
