"""Ranks in finishing order, shared by ``adaptive`` and ``jct``.

Both weigh a job's busy fraction less for a job clearly ahead of it in finishing order:
``jct`` by its remaining time R (shortest-remaining-first, as A-SRPT), ``adaptive`` by the
length of its run per GPU, L/g, at the rate the whole node can give it (Smith's rule for
GPU-weighted completion times). A job is behind another only when its figure is more than
``CLEARLY_AHEAD`` times the other's, so jobs within that factor of each other (two identical
jobs, or noise in M) share a rank, and ranks change only when one job pulls clearly ahead,
not every period.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from controller.policies.base import JobView, NodeResources
from controller.policies.shares import JobModel, evaluate_lines
from controller.policies.worth import young_curve

MIN_NODE_BUSY = 1e-3
"""A job whose curve gives it less than this busy fraction on the whole node counts this: its
length stays finite, and it ranks behind every job that can run."""

CLEARLY_AHEAD = 1.5
"""A job ranks behind another only when its figure (R, or L/g) is more than this many times
the other's."""


def remaining_times(jobs: Sequence[JobView], models: Mapping[str, JobModel]) -> dict[str, float]:
    """R = remaining samples / M, the seconds each modelled job still needs at full speed,
    for the jobs whose remaining samples are known (declared with ``adloader run --samples``
    or carried over by the node's history), as of the node's last arrival or departure where
    the views carry it (JobView.remaining_at_event_samples). R itself shrinks as a job runs,
    fastest for the job served first, so ranks by it drift between events, and each drift is
    a re-plan: on the shipped mix, 13 s after the last arrival, ``jct`` moved resnet50-4g two
    ranks down and re-planned four jobs (measured, 2026-11-25 04:49; a settle of 9.8 s)."""
    return _at_full_speed(
        jobs, models,
        lambda job: job.remaining_at_event_samples if job.remaining_at_event_samples is not None
        else job.remaining_samples)


def run_lengths(jobs: Sequence[JobView], models: Mapping[str, JobModel]) -> dict[str, float]:
    """L = the job's whole length in samples / M, the seconds its whole run needs at full speed
    (its remaining samples where its length is unknown: a job resumed from the state file).
    Unlike R it does not shrink as the job runs, so ranks by it move only when jobs arrive or
    leave: ranked by R, the 2-GPU job of seeded random mix 14 pulled clearly ahead of the others
    7 s after they arrived, and the re-plan that followed came 5.6 s after the last first report,
    past the 5 s settle goal."""
    return _at_full_speed(
        jobs, models, lambda job: job.length_samples if job.length_samples is not None else job.remaining_samples)


def at_node_rate(node: NodeResources, jobs: Sequence[JobView], models: Mapping[str, JobModel],
                 lengths: Mapping[str, float], alike: Sequence[Sequence[str]] = ()) -> dict[str, float]:
    """``lengths`` (seconds at full speed) stretched to the rate the whole node can give each
    job, min(M, T_load(C), B/b): the time it needs with every core to itself, the processing
    time Smith's rule orders by. At full speed, a job a phase made CPU-bound (a sample 4x
    dearer: it needs 14 cores on a 2-core node) still ranked as the shortest per GPU, halved
    the weights of the jobs beside it, and starved a 1-GPU job static would have finished in
    82 s (simulated 2-core phase mixes: 0.83-0.86x static on three of 240, 12 below 0.98x;
    7 below with this; 2 with the completion check as well, against 5 with the check alone).
    Only a curve the node can trust stretches a length: a mature one, or a young one made the
    same as a mature job's (``alike``, groups of jobs of one shape given one curve,
    worth.alike_curves). A young one's own noise moved a job that needs about the node's cores
    across ranks, and a 3-job mix never got its first plan (0.98 -> 0.83x the oracle). But left
    at full speed beside a mature copy of itself stretched, a newcomer ranked with it, and
    behind it one step after its curve matured: on seeded random mix 10 a 4-GPU newcomer's
    first plan kept it level with the 4-GPU job beside it, and 1.5 s later it was halved and
    cut to CPU weight 10 (2026-11-27: settled 5.9 s after its first report). Given one curve,
    the two are stretched alike, so their order is the one at full speed either way."""
    trusted = {job.job_id for job in jobs if not young_curve(job)}
    trusted |= {job_id for group in alike if trusted & set(group) for job_id in group}
    stretched = dict(lengths)
    for job in jobs:
        if job.job_id in stretched and job.job_id in trusted:
            stretched[job.job_id] /= max(node_busy_bound(node, job, models[job.job_id]), MIN_NODE_BUSY)
    return stretched


def node_busy_bound(node: NodeResources, job: JobView, model: JobModel) -> float:
    """The most of its M the whole node could give ``job``: its curve up to the most cores it
    was seen using, and beyond them no more per core than there (a concave curve through the
    origin never gains per core as it grows), within the node's read bandwidth. Not the curve's
    last line extended: fitted through two close, noisy knots it can be nearly flat, and two
    identical jobs, each seen at about one of the two cores, were once ranked 1.5x apart."""
    seen = max((cores for cores, _ in job.loading_curve), default=0.0)
    if 0.0 < seen < node.cores:
        loading = evaluate_lines(model.lines, seen) * node.cores / seen
    else:
        loading = evaluate_lines(model.lines, node.cores)
    if node.read_bps is not None and model.bytes_per_sample > 0:
        loading = min(loading, node.read_bps / model.bytes_per_sample)
    return min(1.0, loading / model.max_throughput)


def _at_full_speed(jobs: Sequence[JobView], models: Mapping[str, JobModel],
                   samples: Callable[[JobView], float | None]) -> dict[str, float]:
    """``samples(job)`` / M for each modelled job whose samples are known."""
    times = {}
    for job in jobs:
        count = samples(job)
        if job.job_id in models and count is not None and count >= 0:
            times[job.job_id] = count / models[job.job_id].max_throughput
    return times


def unknown_as_longest(known: Mapping[str, float], job_ids: Iterable[str]) -> dict[str, float]:
    """Each of ``job_ids`` with its figure in ``known`` (non-empty), or the longest known where
    it has none: a job whose work is unknown ranks with the longest."""
    longest = max(known.values())
    return {job_id: known.get(job_id, longest) for job_id in job_ids}


def ranks_behind(figures: Mapping[str, float], clearly: float = CLEARLY_AHEAD) -> dict[str, int]:
    """For each job, how many jobs are clearly ahead of it: their figure times ``clearly``
    is below its own (lower figures finish first)."""
    return {
        job_id: sum(1 for other in figures.values() if other * clearly < figure)
        for job_id, figure in figures.items()
    }
