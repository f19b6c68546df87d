"""The jobs waiting for this node's GPUs, as plain data in a policy's input.

Where jobs wait for GPUs (Slurm holds them pending), a running job that finishes sooner
lets a waiting one start sooner: shortest-remaining-first then cuts mean completion time
(DESIGN.md, "Queues"). The controller learns what waits from the scheduler
(controller/pending_queue.py) and hands it to the policy in ``NodeResources.pending``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PendingJob:
    """One job the scheduler holds for GPUs that could run on this node."""

    name: str
    gpus: int
    """GPUs it waits for (on this node)."""
    samples: float | None = None
    """Its declared length, where the queue says it; None: unknown."""
