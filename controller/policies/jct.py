"""``jct``: adaptive, but shortest-remaining-first (as A-SRPT) where jobs wait for GPUs.

Where no job waits (``NodeResources.pending`` empty, or no queue watched), ``jct`` is exactly
``adaptive``: when every job already holds its GPUs, finishing one sooner only leaves its GPUs
idle (on the shipped ``jct_lengths`` mix, no queue, ranking cost 6% of mean JCT and GPU busy
against adaptive). Where jobs wait, a job that ends sooner lets a waiting one start sooner, and
mean completion time, counted from submission, falls (DESIGN.md, "Queues").

Each job's busy fraction is weighted by its rank in remaining time instead of by its GPUs:
R_j = remaining samples / M_j, the time it still needs at full speed (its samples as of the
node's last arrival or departure, so ranks move at those events, not as jobs run), and a
job's rank is the number of jobs clearly shorter than it (R at most 1/1.5 of its own,
:mod:`controller.policies.ranks`); each rank weighs ``RANK_FACTOR`` times less than the one
before. The program then gives cores to the job closest to finishing first, and the others
keep their floor until it leaves. A job whose remaining work is unknown ranks with the
longest known one; when no job's is known the policy is exactly ``adaptive``.

Why ranks, not 1/R: with weights 1/R the job about to finish outweighed the others more and
more as its R shrank, until the predicted gain of giving it everything passed the urgent
bar: on the shipped mix ``jct`` re-planned 18.8 s after the last arrival, 0.6 s before that
job left, for nothing (the node's settle had been 3 s). Ranks change only when one job
becomes clearly shorter than another at an arrival or departure, so between them the plan holds;
jobs within 1.5x of each other's remaining time (noise in M, or two jobs crossing) share a
rank instead of trading the node.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from controller.policies.adaptive import AdaptivePolicy
from controller.policies.base import JobView, NodeResources
from controller.policies.ranks import ranks_behind, remaining_times, unknown_as_longest
from controller.policies.shares import JobModel

RANK_FACTOR = 8.0
"""How many times a rank outweighs the next: a job ahead is served first (shortest-remaining-
first), the cores it cannot use flow on down the ranks."""


class JctPolicy(AdaptivePolicy):
    name = "jct"

    def weighing(self, node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel]
                 ) -> tuple[dict[str, float], dict[str, float]]:
        """Worth weight 1 for every job, finishing-order factor ``RANK_FACTOR`` to the minus its
        rank in remaining time where jobs wait for the node's GPUs; ``adaptive``'s where none
        waits, or no job's remaining work is known."""
        remaining = remaining_times(jobs, models)
        if not node.pending or not remaining:
            return super().weighing(node, jobs, models)
        times = unknown_as_longest(remaining, models)
        order = {job_id: RANK_FACTOR ** -rank for job_id, rank in ranks_behind(times).items()}
        return dict.fromkeys(times, 1.0), order
