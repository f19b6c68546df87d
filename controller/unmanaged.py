"""Whether a job's loaders are managed, and if not, why, in words.

A job is managed while a loader of one of its ranks reports (adloader's DataLoader sends a
Report about every second). Some jobs never do: their loader is not a torch DataLoader
(DALI, a hand-written ``get_batch``, an IterableDataset read in the main process), they
were started with ``--no-patch``, or their loader fell back to torch's and said so
(``Report.unmanaged_reason``). Such a job must not look ``starting`` for its whole run,
nor ``running``: after a grace period from registration it is *unmanaged*, with the reason
that status, the metrics and the launcher's warning show. Pure: the registry hands in the
reports and the times.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from controller.measurements import RankWindow

DEFAULT_GRACE_S = 60.0
"""Seconds a registered job may take before its first loader report (imports, dataset
indexing, model build) before it is called unmanaged."""

NEVER_REPORTED = ("no loader has reported in {grace:g} s (its loader is not a torch DataLoader, "
                  "or it was started with adloader run --no-substitute)")
STOPPED_REPORTING = "no loader has reported for over {grace:g} s (its loaders have stopped or exited)"
"""Worded with the grace, not the silence: a reason that changed every step would be a new
metrics series (adloader_job_info's label) every step."""


def managed_ranks(ranks: Mapping[int, RankWindow]) -> dict[int, RankWindow]:
    """The ranks whose newest report is a managed loader's: only their counters are a loader's."""
    return {rank: window for rank, window in ranks.items() if window and window[-1][1].unmanaged_reason is None}


def unmanaged_reason(ranks: Mapping[int, RankWindow], now: float, watched_since: float,
                     grace_s: float = DEFAULT_GRACE_S) -> str | None:
    """Why the job is unmanaged at ``now`` (monotonic), or None while it is managed or still
    within ``grace_s`` of ``watched_since`` (its registration, or its adoption by this
    controller). ``ranks``: each rank's reports, (time received, report), oldest first."""
    latest = [window[-1] for window in ranks.values() if window]
    if not latest:
        return None if now - watched_since < grace_s else NEVER_REPORTED.format(grace=grace_s)
    silence = now - max(at for at, _ in latest)
    if silence >= grace_s:
        return STOPPED_REPORTING.format(grace=grace_s)
    if any(report.unmanaged_reason is None for _, report in latest):
        return None
    return _joined(report.unmanaged_reason for _, report in latest if report.unmanaged_reason)


def _joined(reasons: Iterable[str]) -> str:
    """The ranks' reasons, each once, in a stable order."""
    return "; ".join(sorted(set(reasons)))


def state_of(ended: bool, reason: str | None, reported: bool) -> str:
    """The job's state as status shows it: "gone", "unmanaged", "running" or "starting"."""
    if ended:
        return "gone"
    if reason is not None:
        return "unmanaged"
    return "running" if reported else "starting"
