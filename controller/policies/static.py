"""``static``: touch nothing. What users have today: each job's own num_workers and the
kernel's fair share of the CPU."""
from __future__ import annotations

from typing import Sequence

from controller.policies.base import Allocation, JobAllocation, JobView, NodeResources


class StaticPolicy:
    name = "static"

    def allocate(self, node: NodeResources, jobs: Sequence[JobView]) -> Allocation:
        return {job.job_id: JobAllocation() for job in jobs}
