"""How long each job's allocation has been in force, how long since the job set changed,
how long since each job was first seen, which jobs' models became known at this step,
whether a job left at this step, and what each job had left to do when the job set last
changed.

The policies are pure and have no clock or memory, so the loop hands them these facts in
the JobViews (``allocation_age_s``, ``since_event_s``, ``age_s``, ``newly_modelled``,
``departure_step``, ``remaining_at_event_samples``): ``adaptive`` changes a settled job's
limits at most once a minute unless the gain is urgent, settles freely for a while after an
arrival or a departure, and plans a job the step its model becomes known and the jobs left
the step one departs; ``jct`` ranks jobs by the work they had left at the last arrival or
departure, so its ranks do not drift between them; the benchmark's phase-following
``oracle`` knows from a job's age which of its phases it is in.

The loop also says whether the node is still settling (:func:`settling`), so the daemon can
step at its shorter settle period until every newcomer's plan is made.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Mapping, Sequence

from controller.policies.base import JobAllocation, JobView
from controller.policies.shares import measured_model
from controller.policies.worth import MATURE_CURVE_WINDOWS

JOB_SET_EVENTS = frozenset({"arrival", "departure", "adoption", "policy_change"})
"""Events after which the node settles anew."""


class ChangeClock:
    """Remembers when each job's applied allocation last changed, when the job set did, when
    each job was first seen, which jobs were seen without a model, and each job's remaining
    samples at the job set's change."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._changed_at: dict[str, float] = {}
        self._last: dict[str, JobAllocation] = {}
        self._event_at: float | None = None
        self._unmodelled: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._remaining_at_event: dict[str, float] = {}

    def annotate(self, views: Sequence[JobView], events: Iterable[str] = ()) -> list[JobView]:
        """``views`` with their ages filled in; ``events`` happened since the last step. A job
        is newly modelled when it has a model now and had none at the step before: a job
        known from the start (its history's prior, or a model restored after a restart) never
        is, its first plan already used the model."""
        now = self._clock()
        departure_step = "departure" in events
        job_set_changed = self._event_at is None or bool(JOB_SET_EVENTS.intersection(events))
        if job_set_changed:
            self._event_at = now
        self._remember_remaining(views, job_set_changed)
        self._first_seen = {view.job_id: self._first_seen.get(view.job_id, now) for view in views}
        modelled = {view.job_id for view in views if measured_model(view) is not None}
        annotated = [
            dataclasses.replace(
                view,
                allocation_age_s=now - self._changed_at[view.job_id] if view.job_id in self._changed_at else None,
                since_event_s=now - self._event_at,
                age_s=now - self._first_seen[view.job_id],
                newly_modelled=view.job_id in modelled and view.job_id in self._unmodelled,
                departure_step=departure_step,
                remaining_at_event_samples=self._remaining_at_event.get(view.job_id),
            )
            for view in views
        ]
        self._unmodelled = {view.job_id for view in views if view.job_id not in modelled}
        return annotated

    def _remember_remaining(self, views: Sequence[JobView], job_set_changed: bool) -> None:
        """Each job's remaining samples as of the last job set change: taken anew for every
        job at a change, else kept, and taken for a job whose remaining work was unknown."""
        before = {} if job_set_changed else self._remaining_at_event
        self._remaining_at_event = {}
        for view in views:
            remaining = before.get(view.job_id, view.remaining_samples)
            if remaining is not None:
                self._remaining_at_event[view.job_id] = remaining

    def applied(self, allocations: Mapping[str, JobAllocation]) -> None:
        """Record what is in force after a step; jobs missing from it are forgotten."""
        now = self._clock()
        for job_id, allocation in allocations.items():
            if self._last.get(job_id) != allocation:
                self._changed_at[job_id] = now
                self._last[job_id] = allocation
        for job_id in set(self._last) - set(allocations):
            del self._last[job_id]
            self._changed_at.pop(job_id, None)


def step_period(settling_now: bool, period_s: float, settle_period_s: float) -> float:
    """Seconds to the next control step: the settle period while the node settles (never
    longer than the period), else the period. The daemon and the simulator both step by it."""
    return min(settle_period_s, period_s) if settling_now else period_s


def settling(views: Sequence[JobView]) -> bool:
    """True while a plan may still be on its way: a job reporting samples whose loading curve
    rests on fewer than MATURE_CURVE_WINDOWS windows. A curve is learnt from one window per
    control step, so a newcomer is planned after about five steps and its curve matures after
    about ten: at a one-second period ten seconds after its first report, at half a second
    five. Arrivals and departures need no faster steps: each wakes the loop for a step of its
    own (an even share for the newcomer, a re-plan for those left), and a job not reporting yet
    has nothing to learn. With sixteen jobs, stepping faster for ten seconds after each event
    as well cost the controller 2.09% of a core instead of 1.65%."""
    return any(view.achieved is not None and (view.curve_windows or 0) < MATURE_CURVE_WINDOWS for view in views)
