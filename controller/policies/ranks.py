"""Ranks in finishing order, shared by ``adaptive`` and ``jct``.

Both weigh a job's busy fraction less for every job clearly ahead of it in finishing order:
``jct`` by its remaining time R (shortest-remaining-first, as A-SRPT), ``adaptive`` by its
remaining time per GPU, R/g (Smith's rule for GPU-weighted completion times). A job is
behind another only when its figure is more than ``CLEARLY_AHEAD`` times the other's, so
jobs within that factor of each other (two identical jobs, or noise in M) share a rank, and
ranks change only when one job pulls clearly ahead, not every period.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from controller.policies.base import JobView
from controller.policies.shares import JobModel

CLEARLY_AHEAD = 1.5
"""A job ranks behind another only when its figure (R, or R/g) is more than this many times
the other's."""


def remaining_times(jobs: Sequence[JobView], models: Mapping[str, JobModel]) -> dict[str, float]:
    """R = remaining samples / M, the seconds each modelled job still needs at full speed,
    for the jobs whose remaining samples are known (declared with ``adloader run --samples``
    or carried over by the node's history)."""
    return {
        job.job_id: job.remaining_samples / models[job.job_id].max_throughput
        for job in jobs
        if job.job_id in models and job.remaining_samples is not None and job.remaining_samples >= 0
    }


def ranks_behind(figures: Mapping[str, float], clearly: float = CLEARLY_AHEAD) -> dict[str, int]:
    """For each job, how many jobs are clearly ahead of it: their figure times ``clearly``
    is below its own (lower figures finish first)."""
    return {
        job_id: sum(1 for other in figures.values() if other * clearly < figure)
        for job_id, figure in figures.items()
    }
