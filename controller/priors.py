"""What stands in for a job's measurements until its own arrive: the throughput
prediction (from its model's features) and the recollection of its earlier runs.

These are the registry's seams: it is handed callables and knows nothing of the
throughput model or of SQLite (controller/node_memory.py wires both in).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from adloader.protocol import JobSnapshot

log = logging.getLogger(__name__)

Prediction = tuple[float, float, float]
"""(M, low, high) samples/s."""
Predictor = Callable[[dict[str, float], int], "Prediction | None"]
"""(features, gpus) -> (M, low, high) samples/s, or None when it cannot tell."""
JobFinishedHook = Callable[
    ["JobSnapshot", "dict[str, float] | None", "tuple[tuple[float, float], ...]", "int | None", "int | None"], None]
"""(final snapshot, the job's model features, its fitted loading-curve points, its exit code or None
if the launcher went away without one, the length it declared or None): the job history's input."""
Recall = Callable[[str, "dict[str, float] | None", "int | None"], "Recollection | None"]
"""(name, features, declared length or None) -> what earlier runs of the same job, or of jobs like
it, say of it; None: nothing (neither it nor its kind ran here)."""


@dataclass(frozen=True)
class Recollection:
    """What the node remembers of a recurring job's earlier runs (A-SRPT: most jobs recur).
    It stands in for measurements until the job's own arrive, so its first allocation is
    already sized: its length for ``jct``, its loading cost for every policy."""

    samples: float | None = None
    cpu_s_per_sample: float | None = None
    bytes_per_sample: float | None = None


def predict(predictor: Predictor | None, features: dict[str, float] | None, gpus: int,
            job: str) -> Prediction | None:
    """The predictor's answer; None without a predictor or features, or when it fails (a
    model bug must not refuse a job: it just starts unpredicted). ``job`` names it in the log."""
    if predictor is None or not features:
        return None
    try:
        return predictor(features, gpus)
    except Exception:
        log.exception("throughput prediction failed for job %s", job)
        return None


def first_known(*values: float | None) -> float | None:
    """The first value that is known (measured before restored before recalled)."""
    return next((value for value in values if value is not None), None)
