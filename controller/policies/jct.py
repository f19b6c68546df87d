"""``jct``: adaptive, but shortest-remaining-first (as A-SRPT) to cut mean job completion time.

Each job's busy fraction is weighted by its rank in remaining time instead of by its GPUs:
R_j = remaining samples / M_j, the time it still needs at full speed, and a job's rank is
the number of jobs clearly shorter than it (``CLEARLY_SHORTER``: R at most 1/1.5 of its
own); each rank weighs ``RANK_FACTOR`` times less than the one before. The program then
gives cores to the job closest to finishing first, and the others keep their floor until
it leaves. A job whose remaining work is unknown ranks with the longest known one; when no
job's is known the policy is exactly ``adaptive``.

Why ranks, not 1/R: with weights 1/R the job about to finish outweighed the others more and
more as its R shrank, until the predicted gain of giving it everything passed the urgent
bar: on the shipped mix ``jct`` re-planned 18.8 s after the last arrival, 0.6 s before that
job left, for nothing (the node's settle had been 3 s). Ranks change only when one job
becomes clearly shorter than another, so between arrivals and departures the plan holds;
jobs within 1.5x of each other's remaining time (noise in M, or two jobs crossing) share a
rank instead of trading the node.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from controller.policies.adaptive import AdaptivePolicy
from controller.policies.base import JobView
from controller.policies.shares import JobModel

RANK_FACTOR = 8.0
"""How many times a rank outweighs the next: a job ahead is served first (shortest-remaining-
first), the cores it cannot use flow on down the ranks."""
CLEARLY_SHORTER = 1.5
"""A job is ranked behind another only when its remaining time is more than this many times
the other's."""


class JctPolicy(AdaptivePolicy):
    name = "jct"

    def weights(self, jobs: Sequence[JobView], models: Mapping[str, JobModel]) -> dict[str, float]:
        remaining = {
            job.job_id: job.remaining_samples / models[job.job_id].max_throughput
            for job in jobs
            if job.job_id in models and job.remaining_samples is not None and job.remaining_samples >= 0
        }
        if not remaining:
            return super().weights(jobs, models)
        longest = max(remaining.values())
        times = {job.job_id: remaining.get(job.job_id, longest) for job in jobs if job.job_id in models}
        return {
            job_id: RANK_FACTOR ** -sum(1 for other in times.values() if other * CLEARLY_SHORTER < time)
            for job_id, time in times.items()
        }
