"""An operator's pin of a job's DataLoader workers (``adloader workers JOB N``), laid over the
policy's allocation.

Policies stay pure and know nothing of pins: the control loop applies the pins to the finished
allocation, in this one place, before it is recorded and reconciled. A pin is the job's total,
split evenly over its ranks as every worker target is (the Target a rank gets is per rank); it
replaces only the workers (the policy's cores, weight and bandwidth stay), and it never gets
past what the job may run: the node's per-rank cap and what its memory holds beside the node's
reserve (``JobView.max_workers``, controller/worker_memory.py). Pure.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from controller.policies.base import JobAllocation, JobView, NodeResources, worker_limit


def pinned_per_rank(total: int, ranks: int) -> int:
    """A pin of ``total`` workers for the job, a rank: an even split, at least one (a loader keeps one)."""
    return max(1, total // max(1, ranks))


def max_pin(node: NodeResources, ranks: int) -> int:
    """The largest pin the job's ranks can take: the node's per-rank cap on each."""
    return node.max_workers_per_job * max(1, ranks)


def pin(allocation: JobAllocation, total: int, view: JobView, node: NodeResources) -> JobAllocation:
    """``allocation`` with its workers pinned to ``total`` for the job, capped per rank by
    :func:`~controller.policies.base.worker_limit` (node cap, memory)."""
    return replace(allocation, workers=min(pinned_per_rank(total, view.ranks), worker_limit(node, view)))


def apply_pins(node: NodeResources, views: Sequence[JobView], wanted: Mapping[str, JobAllocation],
               pins: Mapping[str, int]) -> dict[str, JobAllocation]:
    """``wanted`` with every pinned job's workers pinned; an unmanaged job has no loader to pin."""
    by_id = {view.job_id: view for view in views}
    return {
        job_id: pin(allocation, pins[job_id], by_id[job_id], node)
        if job_id in pins and job_id in by_id and not by_id[job_id].unmanaged else allocation
        for job_id, allocation in wanted.items()
    }
