"""Two identical jobs under ``adaptive`` share the node evenly and stay put.

Tried as a new user would, two identical jobs had their CPU weights swapped 10 <-> 190
ten times in 40 s and one of them was always starved. The closed-loop test runs the real
policy, the real loop hooks and the real loading-curve estimator against the node model
of bench/sim_node.py (batches counted whole, CPU accounting noise), on the simulated
clock: no sleeping, no timing.
"""
from __future__ import annotations

import pytest

from bench.sim_node import SimJob, SimNode, simulate
from controller.policies import JobAllocation, JobView, NodeResources, make_policy

TWO_CORES = SimNode(cores=2)  # the controller's periods: 1 s, 0.5 s while settling


def _identical(n: int, seconds: float) -> list[SimJob]:
    # each needs 4 cores to keep its GPU busy: on two cores they contend for every cycle
    return [SimJob(name=f"same-{i}", gpus=1, max_throughput=200.0, cpu_s_per_sample=0.02,
                   samples=50.0 * seconds, requested_workers=4, batch_size=16) for i in range(n)]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_two_identical_jobs_share_evenly_and_stay_put(seed: int) -> None:
    result = simulate(TWO_CORES, _identical(2, seconds=120.0), make_policy("adaptive"), seed=seed)
    both = [step for step in result.steps if len(step.allocations) == 2]
    assert len(both) > 100
    for step in both:
        (_, weight_a, workers_a), (_, weight_b, workers_b) = step.allocations.values()
        assert weight_a == weight_b and workers_a == workers_b, step
    changes = sum(1 for before, after in zip(both, both[1:]) if before.allocations != after.allocations)
    assert changes == 0
    busy = [job["busy_s"] / job["wall_s"] for job in result.jobs.values()]
    assert min(busy) > 0.2  # nobody starved: each gets its core (a quarter of its GPU's need)


def test_jobs_worth_the_same_up_to_noise_get_the_same_weight_and_workers() -> None:
    node = NodeResources(cpus=(0, 1))
    policy = make_policy("adaptive")
    for rate_a, rate_b in ((50.0, 50.0), (50.0, 60.0), (60.0, 50.0), (50.0, 70.0)):
        jobs = [JobView(job_id=job_id, name="same", max_throughput=200.0, loading_curve=((1.0, rate),),
                        current=JobAllocation()) for job_id, rate in (("a", rate_a), ("b", rate_b))]
        allocation = policy.allocate(node, jobs)
        assert allocation["a"].cpu_weight == allocation["b"].cpu_weight, (rate_a, rate_b)
        assert allocation["a"].workers == allocation["b"].workers


def test_a_job_clearly_worth_more_per_core_is_still_served_first() -> None:
    node = NodeResources(cpus=(0, 1))
    jobs = [JobView(job_id="four-gpus", name="x", gpus=4, max_throughput=200.0, loading_curve=((1.0, 50.0),)),
            JobView(job_id="one-gpu", name="y", gpus=1, max_throughput=200.0, loading_curve=((1.0, 50.0),))]
    allocation = make_policy("adaptive").allocate(node, jobs)
    assert allocation["four-gpus"].cpu_weight > 5 * allocation["one-gpu"].cpu_weight


@pytest.mark.parametrize(("ratio", "batches", "equal"), [
    (1.7, 10.0, True),     # curves 1.7x apart, each counted from ten batches: noise, planned as equals
    (1.7, 1000.0, False),  # the same gap counted from a thousand batches is real
    (1.7, None, False),    # not counted (resumed from a checkpoint): no doubt
    (6.0, 10.0, False),    # 6x apart is beyond the noise of ten batches: told apart at once
])
def test_curves_counted_from_few_batches_are_planned_as_equals_until_the_gap_beats_the_noise(
        ratio: float, batches: float | None, equal: bool) -> None:
    node = NodeResources(cpus=(0, 1))
    jobs = [JobView(job_id=job_id, name="x", max_throughput=200.0, loading_curve=((1.0, rate),),
                    curve_windows=4, curve_batches=batches, current=JobAllocation())
            for job_id, rate in (("a", 50.0), ("b", 50.0 * ratio))]
    allocation = make_policy("adaptive").allocate(node, jobs)
    assert (allocation["a"].cpu_weight == allocation["b"].cpu_weight) is equal
