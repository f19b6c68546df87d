"""Why a job's worker target is what it is, in words its own output prints.

The controller may give a job fewer DataLoader workers than it asked for: its memory holds no
more beside the node's reserve, or the policy plans it fewer cores (workers follow cores), or an operator pinned them
(``adloader workers``). The
job's log then says so once, with this reason (adloader/reporter.py), instead of the change
being visible only in the controller's log. Pure.
"""
from __future__ import annotations

from controller.policies.base import JobAllocation
from controller.policies.shares import SATISFIED_WEIGHT, WEIGHT_PER_CORE
from controller.worker_pins import pinned_per_rank


def target_reason(policy: str, wanted: JobAllocation, ranks: int, memory_limit: int | None,
                  pinned: int | None = None) -> str | None:
    """Why ``wanted.workers`` a rank: an operator's pin (``pinned``, workers all ranks; None: none),
    with what holds the job below it; else the memory cap (``memory_limit``, workers all ranks that
    fit in the job's memory and the node's reserve; None: not measured) when it binds; else the
    cores the ``policy`` gives the job. None when the target leaves the workers alone."""
    if wanted.workers is None:
        return None
    memory = None if memory_limit is None else (f"the job's memory and the node's memory reserve hold {memory_limit} "
                                                 f"worker{'s' if memory_limit != 1 else ''} in all")
    if pinned is not None:
        pin = f"an operator pinned this job's workers to {pinned} in all (adloader workers)"
        if wanted.workers >= pinned_per_rank(pinned, ranks):
            return pin
        return f"{pin}, but {memory}" if memory is not None else \
            f"{pin}; it gets {wanted.workers} a rank until its workers' memory is measured"
    if memory is not None and wanted.workers * max(1, ranks) >= memory_limit:
        return memory
    if wanted.cores is not None:
        return f"the {policy} policy gives this job {wanted.cores:.1f} cores (a CPU quota), and workers follow cores"
    if wanted.cpu_weight is not None:
        weight = wanted.cpu_weight
        cores = (weight - SATISFIED_WEIGHT if weight >= SATISFIED_WEIGHT else weight) / WEIGHT_PER_CORE
        return f"the {policy} policy plans {cores:.1f} cores for this job, and workers follow cores"
    return f"the {policy} policy sets it"
