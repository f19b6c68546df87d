"""``jct``: adaptive, but shortest-remaining-first (as A-SRPT) to cut mean job completion time.

Each job's busy fraction is weighted by 1/R_j, R_j = remaining samples / M_j the time
it still needs at full speed (normalised, the shortest weighs 1), instead of by its GPUs: the program then gives cores
to the job closest to finishing first, and the others keep their floor until it
leaves. A job whose remaining work is unknown ranks with the longest known one;
when no job's is known the policy is exactly ``adaptive``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from controller.policies.adaptive import AdaptivePolicy
from controller.policies.base import JobView
from controller.policies.shares import JobModel


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
        # clamp so a job about to finish cannot push the others' weights to zero; normalise
        # so the largest weight is 1, keeping the program well scaled.
        clamped = {
            job.job_id: max(remaining.get(job.job_id, longest), 1e-3 * longest, 1e-6)
            for job in jobs
            if job.job_id in models
        }
        shortest = min(clamped.values())
        return {job_id: shortest / value for job_id, value in clamped.items()}
