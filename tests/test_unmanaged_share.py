"""An unmanaged job on plain data: when the controller calls a job unmanaged and why
(controller/unmanaged.py), and the CPU share the policies keep for it from what its group
uses, so that the reporting jobs' plans account for it (controller/policies/shares.reserve_of)."""
from __future__ import annotations

import dataclasses
import math
from collections import deque

from adloader.protocol import Report
from controller.policies import JobAllocation, JobView, NodeResources, make_policy
from controller.policies.shares import PLAN_MARGIN, SATISFIED_WEIGHT, WEIGHT_PER_CORE, contended_cores
from controller.unmanaged import NEVER_REPORTED, unmanaged_reason

FALLBACK = "loader fell back to torch's (in_order=False)"


def _window(*times: float, reason: str | None = None) -> deque[tuple[float, Report]]:
    return deque((t, Report(job_id="j", samples=int(10 * t), unmanaged_reason=reason)) for t in times)


def test_a_job_is_starting_within_its_grace_then_unmanaged_until_a_loader_reports() -> None:
    assert unmanaged_reason({}, now=59.9, watched_since=0.0, grace_s=60.0) is None
    assert unmanaged_reason({}, now=60.0, watched_since=0.0, grace_s=60.0) == NEVER_REPORTED.format(grace=60.0)
    assert unmanaged_reason({0: _window(61.0, 62.0)}, now=62.5, watched_since=0.0, grace_s=60.0) is None


def test_a_rank_that_says_why_is_unmanaged_at_once_unless_another_rank_is_managed() -> None:
    fallback = {0: _window(1.0, 2.0, reason=FALLBACK), 1: _window(1.5, reason=FALLBACK)}
    assert unmanaged_reason(fallback, now=2.5, watched_since=0.0) == FALLBACK
    assert unmanaged_reason({**fallback, 2: _window(2.0)}, now=2.5, watched_since=0.0) is None


def test_a_job_whose_loaders_stopped_reporting_is_not_running_past_the_grace() -> None:
    ranks = {0: _window(10.0, 11.0)}
    assert unmanaged_reason(ranks, now=70.9, watched_since=0.0, grace_s=60.0) is None
    assert unmanaged_reason(ranks, now=71.0, watched_since=0.0, grace_s=60.0) == (
        "no loader has reported for over 60 s (its loaders have stopped or exited)")
    assert unmanaged_reason(ranks, now=500.0, watched_since=0.0, grace_s=60.0) == unmanaged_reason(
        ranks, now=71.0, watched_since=0.0, grace_s=60.0)  # one reason, one metrics series, however long


def _hungry(job_id: str, gpus: int = 4) -> JobView:
    """A reporting job whose loading could use far more cores than the node has (10 ms of CPU a sample)."""
    return JobView(job_id=job_id, name=job_id, gpus=gpus, max_throughput=1000.0, loading_curve=((1.0, 100.0),),
                   curve_windows=20, achieved=100.0)


def _planned(given: JobAllocation) -> float:
    assert given.cpu_weight is not None
    weight = given.cpu_weight
    return (weight - SATISFIED_WEIGHT if weight >= SATISFIED_WEIGHT else weight) / WEIGHT_PER_CORE


def test_the_reporting_jobs_plans_leave_an_unmanaged_job_the_cores_it_uses() -> None:
    """The rule's measured effect: an unmanaged job that recurs (its history gives it a model: a
    predicted M and a loading cost) but whose loader is not adloader's this run uses 1.0 core. Planned
    from that model, as a managed job, it is given the floor, and the kernel (CPU weights shared max-min
    fair, cores_used as its demand) gives it 0.1 of its core: the two reporting jobs' plans take the rest.
    Held at what it uses, it keeps its core and they plan within the other three."""
    node = NodeResources(cpus=(0, 1, 2, 3))
    recurring = JobView(job_id="u", name="u", gpus=1, max_throughput=100.0, loading_curve=((1.0, 20.0),),
                        curve_windows=0, cores_used=1.0, unmanaged=True)
    reporting = [_hungry("a"), _hungry("b")]
    policy = make_policy("adaptive")

    def kernel_gives(allocation: dict[str, JobAllocation]) -> dict[str, float]:
        weights = {job_id: float(given.cpu_weight or 100) for job_id, given in allocation.items()}
        return contended_cores(node.cores, weights, {"a": math.inf, "b": math.inf, "u": 1.0})

    held = policy.allocate(node, [*reporting, recurring])
    assert held["u"].workers is None  # no loader of ours to set
    assert _planned(held["u"]) >= 1.0 and _planned(held["a"]) + _planned(held["b"]) <= node.cores - 1.0 + 1e-9
    assert kernel_gives(held)["u"] == 1.0

    as_managed = make_policy("adaptive").allocate(node, [*reporting, dataclasses.replace(recurring, unmanaged=False)])
    assert _planned(as_managed["a"]) + _planned(as_managed["b"]) > node.cores - 0.2
    assert kernel_gives(as_managed)["u"] < 0.2


def test_the_cores_an_unmanaged_job_leaves_go_to_the_reporting_jobs_plans() -> None:
    """A job that has never reported holds an even share while it is a newcomer; unmanaged, it holds
    what it uses (PLAN_MARGIN above), and the reporting job beside it is planned, and given workers,
    for the rest: 1.65 cores and 3 workers instead of 1 core and 2."""
    node = NodeResources(cpus=(0, 1))
    silent = JobView(job_id="u", name="u", gpus=0, cores_used=0.3, unmanaged=True)
    hungry = _hungry("a", gpus=1)

    unmanaged = make_policy("adaptive").allocate(node, [hungry, silent])
    assert math.isclose(_planned(unmanaged["u"]), PLAN_MARGIN * 0.3, abs_tol=0.01)
    assert _planned(unmanaged["a"]) >= 1.6 and unmanaged["a"].workers == 3

    newcomer = make_policy("adaptive").allocate(node, [hungry, dataclasses.replace(silent, unmanaged=False)])
    assert _planned(newcomer["a"]) == 1.0 and newcomer["a"].workers == 2


def test_an_unmanaged_job_keeps_at_most_its_fair_share_and_the_share_until_its_use_is_measured() -> None:
    node = NodeResources(cpus=(0, 1))
    greedy = JobView(job_id="u", name="u", cores_used=1.9, unmanaged=True)
    assert _planned(make_policy("adaptive").allocate(node, [_hungry("a"), greedy])["u"]) == 1.0
    unmeasured = dataclasses.replace(greedy, cores_used=None)
    assert _planned(make_policy("adaptive").allocate(node, [_hungry("a"), unmeasured])["u"]) == 1.0


def test_even_splits_with_an_unmanaged_job_but_gives_it_no_workers_static_touches_nothing() -> None:
    node = NodeResources(cpus=(0, 1))
    silent = JobView(job_id="u", name="u", cores_used=0.3, unmanaged=True)
    even = make_policy("even").allocate(node, [_hungry("a"), silent])
    assert (even["u"].cores, even["u"].workers) == (1.0, None) and even["a"].workers == 1
    assert make_policy("static").allocate(node, [_hungry("a"), silent])["u"] == JobAllocation()


def test_a_job_found_unmanaged_is_planned_anew_not_kept_at_its_newcomers_placeholder() -> None:
    """Its even share was a newcomer's placeholder: kept for gaining nothing (the job has no model,
    so no plan for it predicts a gain), it held half of a core it used a tenth of for the whole run."""
    node = NodeResources(cpus=(0,))
    policy = make_policy("adaptive")
    newcomer = JobView(job_id="u", name="u", cores_used=0.1, since_event_s=30.0, allocation_age_s=30.0)
    first = policy.allocate(node, [_hungry("a"), newcomer])
    assert _planned(first["u"]) == 0.5
    found = dataclasses.replace(newcomer, unmanaged=True, current=first["u"])
    then = policy.allocate(node, [dataclasses.replace(_hungry("a"), current=first["a"], since_event_s=30.0,
                                                      allocation_age_s=30.0), found])
    assert then["u"].workers is None and math.isclose(_planned(then["u"]), PLAN_MARGIN * 0.1, abs_tol=0.01)


def test_an_unmanaged_job_placed_before_its_use_was_measured_is_held_at_its_use_once_it_is() -> None:
    """Found unmanaged at the step another job arrived, before its group's use was measured, a job
    is given an even share (weight 50 of one core here). Once its use is measured the plan holds it
    at what it uses, though the reporting job's plan gains too little to pass the bar: kept, the
    placeholder stayed for good (the end-to-end test, tests/test_unmanaged.py, failed 9 of 19 runs
    here). A hold near its use is kept."""
    node = NodeResources(cpus=(0,))
    ages = {"allocation_age_s": 0.5, "since_event_s": 0.5, "age_s": 0.5}
    keeping_up = JobView(job_id="m", name="m", gpus=1, max_throughput=100.0, loading_curve=((0.0, 1000.0),),
                         curve_windows=20, achieved=100.0, current=JobAllocation(cpu_weight=50, cpus=(0,), workers=1),
                         **ages)
    placed = JobView(job_id="u", name="u", unmanaged=True, cores_used=0.1,
                     current=JobAllocation(cpu_weight=50, cpus=(0,)), **ages)
    measured = make_policy("adaptive").allocate(node, [keeping_up, placed])
    assert measured["u"].cpu_weight < 40 and measured["m"].cpu_weight > 60  # 0.1 core used, far below half
    near = dataclasses.replace(placed, current=measured["u"], cores_used=0.12)
    kept = make_policy("adaptive").allocate(node, [dataclasses.replace(keeping_up, current=measured["m"]), near])
    assert kept["u"] == measured["u"]
