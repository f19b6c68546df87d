"""adaptive's completion check: a plan that starves a job is made only when it is predicted to
finish the jobs sooner, GPU-weighted (controller/policies/completion.py)."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from controller.policies import JobAllocation, JobView, NodeResources
from controller.policies.adaptive import STARVED, AdaptivePolicy
from controller.policies.completion import weighted_completion_s
from controller.policies.shares import measured_model, predicted_busy

TWO_CORES = NodeResources(cpus=(0, 1))
PLACEHOLDER = JobAllocation(cpu_weight=100, workers=2)
"""What each job held before its plan: an even share by CPU weight, its two workers."""


def job(job_id: str, gpus: int, m: float, p: float, remaining: float | None, **fields: object) -> JobView:
    """A job with a linear loading curve (p CPU seconds a sample, M samples/s at most) that has
    held ``PLACEHOLDER`` for a while on a settled node, its curve mature."""
    settled = dict(current=PLACEHOLDER, allocation_age_s=120.0, since_event_s=120.0, curve_windows=40)
    return JobView(job_id=job_id, name=job_id, gpus=gpus, max_throughput=m, loading_curve=((1.0, 1.0 / p),),
                   remaining_samples=remaining, length_samples=remaining, **{**settled, **fields})


def models_of(jobs: list[JobView]) -> dict:
    return {j.job_id: measured_model(j) for j in jobs}


def test_completion_times_follow_the_first_allocation_then_each_replan() -> None:
    """Two jobs loading `slope` samples per core-second, at most 100/s: `a` (1 GPU) has 1000
    samples left and a quota of one core; `b` (2 GPUs) 3000 and half a core until `a`
    finishes, then all it needs."""
    jobs = [job("a", 1, 100.0, 0.01, 1000.0), job("b", 2, 100.0, 0.01, 3000.0)]
    models = models_of(jobs)
    ((_, slope),) = models["a"].lines  # the plan's margin below the measured 100 a core-second
    first = {"a": JobAllocation(cores=1.0), "b": JobAllocation(cores=0.5)}
    replans: list[list[str]] = []

    def replan(left: list[JobView]) -> dict[str, JobAllocation]:
        replans.append([j.job_id for j in left])
        return {j.job_id: JobAllocation(cores=2.0) for j in left}

    a_done = 1000.0 / slope
    b_done = a_done + (3000.0 - 0.5 * slope * a_done) / 100.0  # half a core's rate, then M
    assert weighted_completion_s(TWO_CORES, jobs, models, first, replan) == pytest.approx(
        1 * a_done + 2 * b_done)
    assert replans == [["b"]]


def test_no_completion_times_without_every_jobs_remaining_work_or_a_rate() -> None:
    jobs = [job("a", 1, 100.0, 0.01, 1000.0), job("b", 1, 100.0, 0.01, None)]
    unused = {j.job_id: JobAllocation(cores=1.0) for j in jobs}
    assert weighted_completion_s(TWO_CORES, jobs, models_of(jobs), unused, lambda left: unused) is None
    stuck = [job("a", 1, 100.0, 0.01, 1000.0)]
    assert weighted_completion_s(TWO_CORES, stuck, models_of(stuck), {"a": JobAllocation(cores=0.0)},
                                 lambda left: {}) is None


def four_two_core_jobs(remaining: bool) -> list[JobView]:
    """Simulated 2-core phase mix 4-42 at 60 s: a 4-GPU job needing 2.8 cores, the shortest per
    GPU, beside three 1-GPU jobs that need 0.2-0.8 cores each (`c` 4x dearer since its phase). Their lengths are known (the
    finishing order ranks by them); their remaining samples only if ``remaining``."""
    jobs = [
        job("big-4g", 4, 1135.0, 0.00247, 80_000.0),
        job("a-1g", 1, 911.0, 0.00056, 40_000.0),
        job("b-1g", 1, 101.0, 0.00448, 6_000.0),
        job("c-1g", 1, 83.0, 0.00988, 4_500.0),
    ]
    return jobs if remaining else [dataclasses.replace(j, remaining_samples=None) for j in jobs]


def test_a_plan_that_starves_small_jobs_for_a_little_rate_is_not_made(caplog: pytest.LogCaptureFixture) -> None:
    """Their plan gives the 4-GPU job the node and holds the others near their floors: more
    rate, Σ w·busy, now, but the three small jobs trickle along through its whole run. With
    every job's remaining samples known the check keeps the even shares; without them (no
    check) the plan is made."""
    policy = AdaptivePolicy()
    unknown = four_two_core_jobs(remaining=False)
    plan = policy.allocate(TWO_CORES, unknown)
    assert plan != {j.job_id: PLACEHOLDER for j in unknown}  # the rate alone says re-plan
    models = models_of(unknown)
    before, after = predicted_busy(TWO_CORES, unknown, models, {j.job_id: PLACEHOLDER for j in unknown}), \
        predicted_busy(TWO_CORES, unknown, models, plan)
    assert any(after[j] < STARVED * before[j] for j in before)  # it starves someone: checked

    known = four_two_core_jobs(remaining=True)
    with caplog.at_level(logging.INFO, logger="controller.policies.adaptive"):
        for _ in range(3):
            assert policy.allocate(TWO_CORES, known) == {j.job_id: PLACEHOLDER for j in known}
    reasons = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(reasons) == 1 and "would starve a-1g, b-1g, c-1g" in reasons[0]  # said once, with why


def test_a_plan_that_serves_one_job_first_is_made_when_it_finishes_the_jobs_sooner() -> None:
    """Simulated 2-core phase mix 2-57: two 4-GPU jobs, one 5x cheaper a sample. Serving the
    cheap one first starves the other, and finishes both sooner, GPU-weighted."""
    jobs = [job("dear-4g", 4, 547.0, 0.00448, 47_000.0), job("cheap-4g", 4, 1559.0, 0.00089, 127_000.0)]
    plan = AdaptivePolicy().allocate(TWO_CORES, jobs)
    assert plan["cheap-4g"].cpu_weight > 10 * plan["dear-4g"].cpu_weight


def test_the_check_never_holds_a_jobs_first_plan() -> None:
    """At the step a job's model becomes known what it holds is a placeholder, not a plan."""
    jobs = [dataclasses.replace(j, newly_modelled=j.job_id == "a-1g") for j in four_two_core_jobs(remaining=True)]
    assert AdaptivePolicy().allocate(TWO_CORES, jobs) != {j.job_id: PLACEHOLDER for j in jobs}
