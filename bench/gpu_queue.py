"""Jobs waiting for the node's GPUs, first come first served, as a scheduler holds them.

A mix that gives the node's GPUs (``"gpus"`` in bench/mix.py) runs as a Slurm node does: a
job that arrives when too few GPUs are free waits, and the jobs waiting start in their order
of arrival as GPUs free, the first one blocking those behind it (no backfill). Shared by the
node benchmark (bench/runner.py) and the simulator (bench/sim_node.py) so both queue alike.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

Job = TypeVar("Job")


def starting_now(waiting: Sequence[Job], free_gpus: int | None, gpus_of: Callable[[Job], int]) -> list[Job]:
    """The jobs at the head of ``waiting`` (in arrival order) that start now with ``free_gpus``
    free: each in turn while it fits, stopping at the first that does not. ``free_gpus`` None:
    the node's GPUs are not modelled, every job starts."""
    if free_gpus is None:
        return list(waiting)
    started = []
    for job in waiting:
        need = gpus_of(job)
        if need > free_gpus:
            break
        started.append(job)
        free_gpus -= need
    return started
