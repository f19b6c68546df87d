"""``even``: split cores, read bandwidth and workers evenly between the jobs
(A-Dloader's baseline). All jobs share the managed cpuset; the quota splits it."""
from __future__ import annotations

from typing import Sequence

from controller.policies.base import Allocation, JobAllocation, JobView, NodeResources, worker_limit, workers_for_cores


class EvenPolicy:
    name = "even"

    def allocate(self, node: NodeResources, jobs: Sequence[JobView]) -> Allocation:
        if not jobs:
            return {}
        cores = max(node.min_cores_per_job, node.cores / len(jobs))
        read_bps = int(node.read_bps / len(jobs)) if node.read_bps else None
        allocation: dict[str, JobAllocation] = {}
        for job in jobs:
            workers = None if job.unmanaged else workers_for_cores(cores / max(1, job.ranks), limit=worker_limit(node, job))
            allocation[job.job_id] = JobAllocation(cores=cores, cpus=node.cpus, read_bps=read_bps, workers=workers)
        return allocation
