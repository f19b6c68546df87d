"""Jobs worth the same, up to measurement noise, are planned as equals.

The linear program values a job's busy time by its weight (GPUs) per sample and its
loading curve's samples per core: the worth of a core to it, w·s/M. Two identical jobs
never measure the same worth: on a busy node their curves differ by up to ±20% from
one window to the next, and a starved job (few cores, few batches per window) measures
the noisiest of all. Handed such models, the program gives every contended core to
whichever job measured a few percent better this period, and the next period to the
other one: CPU weights swapped 10 <-> 190 ten times in 40 s for two identical jobs on
two cores, one of them always starved.

So before planning, jobs whose worth per core lies within ``WORTH_TOLERANCE`` of each
other are grouped and each is planned with the group's worth (its curve scaled, its M
and GPUs untouched). The program is then indifferent between them, and a max-min term per
group keeps them equally busy (:mod:`controller.policies.lp`: one term for the whole node
lifted only the least busy job, and two equals above it were split at a vertex); jobs clearly
worth more per core (more GPUs, cheaper samples) are still served first.

A policy's weight has two parts: a worth weight (GPUs), and a finishing-order factor that is
exact, not measured (``adaptive`` halves the weight of a job clearly longer per GPU than
another). Only the curves are noisy, so they are pooled first on their own: jobs of one shape
(the same GPUs, curves the same up to counting noise) get one curve, and the order then sets
them apart from the first plan. Pooled on the whole weight, the noise of young curves hid
the order's 2x: four same-shape jobs of lengths 1:2:4:8 (bench/mixes/jct_lengths.json) were
planned as equals, then re-planned once their curves had counted enough batches to tell the
shortest apart, 5.2 and 7.3 s after they started (up to 12 s in the simulator).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from controller.policies.base import JobView
from controller.policies.shares import JobModel

WORTH_TOLERANCE = 0.5
"""Worths within this factor of a group's lowest count as equal. The models of two identical
jobs measured on a busy two-core node differed by up to ±20%, and a starved job's more (few
whole batches per window): in the simulator two identical jobs still traded the node at
0.25 and stayed put at 0.5. Jobs that differ for real differ more: GPUs 2x or 4x, loading
cost 2x to 5x between image sizes."""


MATURE_CURVE_WINDOWS = 8
"""Windows after which a job's curve counts as mature: until then the node has not settled
(policies/adaptive.py, controller/change_clock.py)."""

EVIDENCE_Z = 3.0
"""How many standard deviations of counting noise two worths must differ by before they are
told apart. A curve's rate is counted in whole batches: from n of them its relative noise is
about 1/sqrt(n), and the log-ratio of two jobs' worths has about sqrt(1/n_a + 1/n_b). The
windows overlap and come every step, so at a half-second settle period eight windows hold
only some four seconds of batches: two identical jobs delivering three batches a second each
were 1.7x apart at maturity and one of them got every contended core (the simulator at the
controller's default periods: 18 of 40 seeds under the fixed 2x tolerance for young curves
this replaces, 1 of 40 with 2 standard deviations, 0 of 40 with 2.5 to 3.5). Jobs counting
many batches are told apart as soon as their curves are trusted; a starved newcomer 1.8x
from a neighbour waits until it has counted some 25 batches (7 s after its first report on
simulated random mix 3, where the 20 seeded mixes otherwise settle within 4.5 s)."""


def counted_batches(jobs: Sequence[JobView]) -> dict[str, float]:
    """The batches behind each job's curve, where they were counted (JobView.curve_batches)."""
    return {job.job_id: job.curve_batches for job in jobs if job.curve_batches is not None}


def young_curve(job: JobView) -> bool:
    """The job's loading curve is known but rests on fewer than MATURE_CURVE_WINDOWS windows."""
    return bool(job.loading_curve) and job.curve_windows is not None and job.curve_windows < MATURE_CURVE_WINDOWS


def worth_per_core(model: JobModel, weight: float) -> float:
    """Objective gained per core at low cores: weight × (samples per core-second) / M.
    Infinite when the curve says cores never bind."""
    slopes = [slope for _, slope in model.lines if slope > 0]
    if not slopes:
        return math.inf
    return weight * max(slopes) / model.max_throughput


def pool_equal_worth(
    models: Mapping[str, JobModel], worth: Mapping[str, float], weights: Mapping[str, float],
    evidence: Mapping[str, float], widest: float,
) -> tuple[dict[str, JobModel], list[list[str]]]:
    """``models`` pooled for planning with ``weights``, and the groups of equals they were pooled in
    (for the program to keep equally busy, :func:`controller.policies.lp.solve`): each a job's
    ``worth`` weight times its finishing-order factor (the order): first the curves of jobs of
    one shape are made the same, jobs of equal worth weight whose worth per core is the same up
    to counting noise alone (at most ``widest`` apart: no tolerance, so mature curves are left
    as measured); then the jobs of about equal worth per core under the whole weight
    (:func:`equal_worth_groups`) are planned with their group's worth. ``widest`` is at most
    the smallest step of the order: of two curves taken for the same, the one behind in order
    is then worth at most as much per core as the one ahead, so serving the one ahead first is
    never a mistake the noise made. Across GPU counts it was such a mistake: on the simulated
    2-core phase mixes a job starved by the order never counted enough batches to be told
    apart again (4 jobs: that mix 0.93x the oracle, 0.99x when pooled on the whole weight)."""
    curves, alike = alike_curves(models, worth, evidence, widest)
    equals = equal_worth_groups(curves, weights, evidence=evidence, alike=alike)
    return pooled(curves, weights, equals), equals


def alike_curves(models: Mapping[str, JobModel], worth: Mapping[str, float], evidence: Mapping[str, float],
                 widest: float) -> tuple[dict[str, JobModel], list[list[str]]]:
    """``models`` with the curves of jobs of one shape made the same (equal ``worth`` weight,
    worth per core the same up to the counting noise of ``evidence`` alone, at most ``widest``
    apart), and those groups of jobs."""
    alike = [group for weight in set(worth.values()) for group in equal_worth_groups(
        {job_id: model for job_id, model in models.items() if worth[job_id] == weight}, worth,
        tolerance=0.0, evidence=evidence, widest=widest)]
    return pooled(models, worth, alike), alike


def equal_worth_groups(
    models: Mapping[str, JobModel], weights: Mapping[str, float], tolerance: float = WORTH_TOLERANCE,
    evidence: Mapping[str, float] | None = None, widest: float = math.inf,
    alike: Sequence[Sequence[str]] = (),
) -> list[list[str]]:
    """Groups of jobs of about equal worth per core: sorted by worth, each starting at its lowest
    member and holding every job within ``1 + tolerance`` of it, or within EVIDENCE_Z standard
    deviations of the counting noise of the batches in ``evidence`` where that is wider, up to
    ``widest`` times (a job missing from ``evidence`` has no such noise; two jobs of one group
    of ``alike`` have none between them: their curves were made the same)."""
    worth = {job_id: worth_per_core(model, weights[job_id]) for job_id, model in models.items()}
    ordered = sorted((w, job_id) for job_id, w in worth.items() if math.isfinite(w) and w > 0)
    evidence = evidence or {}
    group_of = {job_id: n for n, group in enumerate(alike) for job_id in group}

    def within(low: str, high: str) -> float:
        if low in group_of and group_of.get(high) == group_of[low]:
            return tolerance
        variance = sum(1.0 / max(1.0, evidence[j]) for j in (low, high) if j in evidence)
        return max(tolerance, min(widest - 1.0, math.exp(EVIDENCE_Z * math.sqrt(variance)) - 1.0))

    groups = []
    start = 0
    while start < len(ordered):
        end = start + 1
        while end < len(ordered) and ordered[end][0] <= ordered[start][0] * (
                1.0 + within(ordered[start][1], ordered[end][1])):
            end += 1
        groups.append([job_id for _, job_id in ordered[start:end]])
        start = end
    return groups


def pooled(models: Mapping[str, JobModel], weights: Mapping[str, float],
           groups: Sequence[Sequence[str]]) -> dict[str, JobModel]:
    """``models`` with the curves of each group's jobs scaled to the group's geometric-mean
    worth per core."""
    result = dict(models)
    for group in groups:
        if len(group) > 1:
            worth = {job_id: worth_per_core(models[job_id], weights[job_id]) for job_id in group}
            mean = math.exp(sum(math.log(w) for w in worth.values()) / len(group))
            for job_id in group:
                result[job_id] = scaled(models[job_id], mean / worth[job_id])
    return result


def scaled(model: JobModel, factor: float) -> JobModel:
    """The model with its loading curve multiplied by ``factor``."""
    lines = tuple((intercept * factor, slope * factor) for intercept, slope in model.lines)
    return JobModel(max_throughput=model.max_throughput, lines=lines, bytes_per_sample=model.bytes_per_sample)
