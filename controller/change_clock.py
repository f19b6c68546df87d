"""How long each job's allocation has been in force, and how long since the job set changed.

The policies are pure and have no clock, so the loop hands them these ages in the
JobViews (``allocation_age_s``, ``since_event_s``): ``adaptive`` changes a settled
job's limits at most once a minute unless the gain is urgent, and settles freely for a
while after an arrival or a departure.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Mapping, Sequence

from controller.policies.base import JobAllocation, JobView

JOB_SET_EVENTS = frozenset({"arrival", "departure", "adoption", "policy_change"})
"""Events after which the node settles anew."""


class ChangeClock:
    """Remembers when each job's applied allocation last changed and when the job set did."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._changed_at: dict[str, float] = {}
        self._last: dict[str, JobAllocation] = {}
        self._event_at: float | None = None

    def annotate(self, views: Sequence[JobView], events: Iterable[str] = ()) -> list[JobView]:
        """``views`` with their ages filled in; ``events`` happened since the last step."""
        now = self._clock()
        if self._event_at is None or JOB_SET_EVENTS.intersection(events):
            self._event_at = now
        return [
            dataclasses.replace(
                view,
                allocation_age_s=now - self._changed_at[view.job_id] if view.job_id in self._changed_at else None,
                since_event_s=now - self._event_at,
            )
            for view in views
        ]

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
