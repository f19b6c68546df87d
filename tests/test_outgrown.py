"""A job that used clearly more cores than its model plans for its rate has outgrown the model
(controller/policies/outgrown.py): the plan, and the safety net's judgement of it, use the model
made dearer, and ``adaptive`` evens out the group of equals the job entered."""
from __future__ import annotations

import dataclasses
import logging
import math

import pytest

from controller.policies import JobAllocation, JobView, NodeResources
from controller.policies.adaptive import AdaptivePolicy
from controller.policies.outgrown import followed, outgrowth
from controller.policies.shares import measured_model, predicted_busy
from controller.policies.worth import EVIDENCE_Z
from controller.safety_net import _planned_rates

TWO_CORES = NodeResources(cpus=(0, 1))


def job(job_id: str, p: float, m: float, used: float | None, achieved: float | None, batches: float | None,
        **fields: object) -> JobView:
    """A 1-GPU job with a mature linear loading curve (p CPU seconds a sample, M at most) that
    used ``used`` cores for ``achieved`` samples/s over a window of ``batches`` batches."""
    base = dict(gpus=1, max_throughput=m, loading_curve=((1.0, 1.0 / p),), curve_windows=40, batch_size=32,
                cores_used=used, achieved=achieved, window_batches=batches)
    return JobView(job_id=job_id, name=job_id, **{**base, **fields})


def test_a_window_that_used_clearly_more_cores_makes_the_model_dearer_by_what_it_shows() -> None:
    view = job("a", p=0.01, m=200.0, used=2.0, achieved=100.0, batches=64.0)
    model = measured_model(view)
    planned = model.cores_for(100.0)  # the plan's cores for 100/s: 1.15 (its margin over 1.0 seen used)
    factor = outgrowth(view, model)
    # used against the cores the curve saw used, less three standard deviations of 64 batches
    assert factor == pytest.approx(2.0 / 1.0 * math.exp(-EVIDENCE_Z / 8.0))
    assert followed(view, model).cores_for(100.0) == pytest.approx(planned * factor)
    assert followed(view, model).max_throughput == model.max_throughput  # M is not a loading cost


@pytest.mark.parametrize("change", [
    dict(window_batches=10.0),  # too few batches to read the rate at all
    dict(curve_windows=3),  # a young curve: its own windows are still being learnt
    dict(cores_used=1.3),  # 1.13x the plan: within the margin and noise
    dict(cores_used=0.3, achieved=15.0, window_batches=20.0),  # 2x a light job's 0.17: under 0.25 cores more
    dict(cores_used=None),
    dict(achieved=0.0),
], ids=["few-batches", "young-curve", "within-margin", "light-job", "no-cpu", "no-samples"])
def test_a_job_within_its_model_or_read_too_thinly_keeps_it(change: dict) -> None:
    view = dataclasses.replace(job("a", p=0.01, m=200.0, used=2.0, achieved=100.0, batches=64.0), **change)
    model = measured_model(view)
    assert outgrowth(view, model) is None
    assert followed(view, model) is model


def crossing_pair_after_the_phases(remaining: tuple[float, float] | None) -> list[JobView]:
    """The crossing pair (bench/mixes/crossing_pair_sharp.json) seen 2 s after its phases crossed:
    `a` holds the satisfied weight it got in its cheap phase and now takes 1.95 cores at 3x the
    cost; `b`, cheap now, still carries its dear curve and is starved. Both are worth the same
    per core by their models once `a` is read dearer."""
    settled = dict(since_event_s=40.0, allocation_age_s=35.0, remaining_samples=None)
    a = job("a", p=0.0025, m=400.0, used=1.95, achieved=250.0, batches=80.0,
            current=JobAllocation(cpu_weight=1130, workers=3), **settled)
    b = job("b", p=0.0075, m=400.0, used=0.1, achieved=30.0, batches=5.0,
            current=JobAllocation(cpu_weight=70, workers=2), **settled)
    if remaining is not None:
        a, b = (dataclasses.replace(v, remaining_samples=r, length_samples=20_000.0) for v, r in zip((a, b), remaining))
    return [a, b]


def test_adaptive_evens_out_the_equals_a_job_outgrew_its_model_into(caplog: pytest.LogCaptureFixture) -> None:
    """Worth the same, the held split and an even one score alike, and the once-a-minute rule
    would hold the change: the load has changed, so neither keeps the split."""
    policy = AdaptivePolicy()
    jobs = crossing_pair_after_the_phases(remaining=None)
    with caplog.at_level(logging.INFO, logger="controller.policies.adaptive"):
        plan = policy.allocate(TWO_CORES, jobs)
        policy.allocate(TWO_CORES, jobs)
    assert plan["a"].cpu_weight == plan["b"].cpu_weight < 1000
    outgrown = [r.getMessage() for r in caplog.records if "planned" in r.getMessage() and "dearer" in r.getMessage()]
    assert len(outgrown) == 1 and outgrown[0].startswith("adaptive: a used 1.95 cores")  # once, while it lasts


def test_evening_out_waits_when_it_would_finish_the_jobs_later() -> None:
    """`a` has little left: cutting it to an even share delays it more than it speeds `b`."""
    policy = AdaptivePolicy()
    jobs = crossing_pair_after_the_phases(remaining=(300.0, 15_000.0))
    plan = policy.allocate(TWO_CORES, jobs)
    assert plan == {j.job_id: j.current for j in jobs}


def test_the_safety_net_judges_an_outgrown_job_by_its_dearer_model() -> None:
    """Judged by its old curve, `a` cut to an even share would be expected at its old rate,
    which the dearer phase cannot give, and the cut taken back."""
    jobs = crossing_pair_after_the_phases(remaining=None)
    even = {j.job_id: JobAllocation(cpu_weight=100, workers=2) for j in jobs}
    a = jobs[0]
    old_model = measured_model(a)
    old_rate = predicted_busy(TWO_CORES, jobs, {"a": old_model, "b": measured_model(jobs[1])}, even)["a"] * 400.0
    assert _planned_rates(TWO_CORES, jobs, even)["a"] < old_rate
