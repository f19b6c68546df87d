"""Properties every policy keeps on any input, hundreds of jobs included: the node is never
overcommitted, floors hold, the answer is deterministic and independent of job order."""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.policies import JobAllocation, JobView, NodeResources, make_policy
from controller.policies.oracle import OraclePolicy
from controller.policies.shares import (
    CONTENDED_SHARE, JobModel, contended_cores, may_read, model_of, read_demand,
)

POLICIES = ["even", "adaptive", "jct", "oracle"]


@st.composite
def job_views(draw: st.DrawFn, max_jobs: int) -> list[JobView]:
    count = draw(st.integers(1, max_jobs))
    jobs = []
    for i in range(count):
        known = draw(st.booleans()) or draw(st.booleans())
        curve: tuple[tuple[float, float], ...] = ()
        if known:
            knots = draw(st.lists(st.tuples(st.floats(0.05, 8.0), st.floats(0.0, 5000.0)), min_size=1, max_size=4))
            curve = tuple(sorted(knots))
        jobs.append(
            JobView(
                job_id=f"job-{i:04d}",
                name=f"name-{i % 7}",
                gpus=draw(st.integers(0, 8)),
                ranks=draw(st.integers(1, 4)),
                max_throughput=draw(st.one_of(st.none(), st.floats(1.0, 5000.0))),
                loading_curve=curve,
                cpu_s_per_sample=draw(st.one_of(st.none(), st.floats(1e-5, 0.1))),
                bytes_per_sample=draw(st.one_of(st.none(), st.just(0.0), st.floats(1.0, 4e6))),
                remaining_samples=draw(st.one_of(st.none(), st.floats(0.0, 1e7))),
            )
        )
    return jobs


nodes = st.builds(
    lambda cpus, read_bps, floor: NodeResources(
        cpus=tuple(range(cpus)), read_bps=read_bps, read_device=None if read_bps is None else "254:0",
        min_cores_per_job=floor,
    ),
    st.integers(1, 64),
    st.one_of(st.none(), st.floats(1e6, 4e9)),
    st.sampled_from([0.05, 0.1, 0.25]),
)


def _policy(name: str, jobs: list[JobView]):
    if name == "oracle":  # true curves: whatever the views' own models say, by name
        return OraclePolicy({j.name: m for j in jobs if (m := model_of(j)) is not None}, steps=8)
    return make_policy(name)


def check_allocation_invariants(
    node: NodeResources, jobs: list[JobView], allocation: dict[str, JobAllocation],
    model_for: Callable[[JobView], JobModel | None] = model_of,
) -> None:
    """``model_for``: the model the policy judges a job by (the oracle's curves go by name)."""
    assert set(allocation) == {j.job_id for j in jobs}
    floor = node.min_cores_per_job
    quotas = [a.cores for a in allocation.values() if a.cores is not None]
    assert all(c >= min(floor, node.cores / len(jobs)) - 1e-9 for c in quotas)
    assert sum(quotas) <= max(node.cores, floor * len(jobs)) + 1e-6
    assert all(c <= node.cores + 1e-9 for c in quotas)
    for view in jobs:
        a = allocation[view.job_id]
        assert 1 <= a.workers <= node.max_workers_per_job
        assert a.cpus == node.cpus
        assert a.cpu_weight is None or 1 <= a.cpu_weight <= 10_000
    weights = {job_id: a.cpu_weight for job_id, a in allocation.items()}
    if any(w is not None for w in weights.values()):  # weight-based: the weights are the plan in cores
        assert all(w is not None for w in weights.values()), "a job without a weight gets the kernel's 100"
        # What the kernel gives each job when all of them run: a modelled job wants the cores
        # that saturate it (the policy's own model), any other job all it can get.
        demands = {view.job_id: m.cores_to_saturate() if (m := model_for(view)) is not None else math.inf
                   for view in jobs}
        planned = contended_cores(node.cores, weights, demands)
        assert sum(planned.values()) <= node.cores + 1e-6
        assert all(c > 0 for c in planned.values()), (planned, weights)  # nobody starved outright
    reads = [a.read_bps for a in allocation.values()]
    if node.read_bps is not None and set(reads) != {None}:  # None for all: no two jobs contend for reads
        assert all(r is not None and r >= 1 for r in reads)
        assert sum(reads) <= node.read_bps + len(jobs)  # ints: at most one byte/s of rounding each
    elif node.read_bps is not None:  # at most one reader, or readers the device serves in full
        readers = [j for j in jobs if may_read(j, model_for(j))]
        assert len(readers) <= 1 or sum(read_demand(j, model_for(j)) for j in readers) < CONTENDED_SHARE * node.read_bps
    else:
        assert all(r is None for r in reads)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=60, deadline=None)
@given(node=nodes, jobs=job_views(max_jobs=12))
def test_small_nodes_are_never_overcommitted(name: str, node: NodeResources, jobs: list[JobView]) -> None:
    policy = _policy(name, jobs)
    allocation = policy.allocate(node, jobs)
    model_for = (lambda view: policy.curves.get(view.name)) if name == "oracle" else model_of
    check_allocation_invariants(node, jobs, allocation, model_for)
    assert policy.allocate(node, jobs) == allocation  # deterministic
    shuffled = list(jobs)
    random.Random(len(jobs)).shuffle(shuffled)
    assert policy.allocate(node, shuffled) == allocation  # order of the views does not matter


@pytest.mark.parametrize("name", ["even", "adaptive", "jct"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.data_too_large, HealthCheck.too_slow])
@given(node=nodes, jobs=job_views(max_jobs=300))
def test_hundreds_of_jobs(name: str, node: NodeResources, jobs: list[JobView]) -> None:
    allocation = make_policy(name).allocate(node, jobs)
    check_allocation_invariants(node, jobs, allocation)


@pytest.mark.parametrize("name", ["adaptive", "jct"])
@settings(max_examples=60, deadline=None)
@given(node=nodes, jobs=job_views(max_jobs=12), limits=st.lists(st.one_of(st.none(), st.floats(0.01, 64.0)),
                                                                min_size=12, max_size=12))
def test_no_job_is_planned_more_cores_than_its_scheduler_lets_it_use(
    name: str, node: NodeResources, jobs: list[JobView], limits: list[float | None],
) -> None:
    """Jobs under different pods (weights do not act across them, so the plan is quotas), each
    with or without a CPU limit of its own (JobView.max_cores). (The quotas may sum to more
    than the node: a satisfied job's quota carries the plan's margin, shares.allocations.)"""
    limited = [dataclasses.replace(job, max_cores=limit, levers=frozenset({"cpu_quota"}))
               for job, limit in zip(jobs, limits)]
    allocation = make_policy(name).allocate(node, limited)
    for job in limited:
        cores = allocation[job.job_id].cores
        assert cores is not None and allocation[job.job_id].cpu_weight is None
        assert cores <= (node.cores if job.max_cores is None else min(node.cores, job.max_cores)) + 1e-9


@settings(max_examples=40, deadline=None)
@given(node=nodes, jobs=job_views(max_jobs=12))
def test_adaptive_keeps_what_it_gave_when_nothing_changed(node: NodeResources, jobs: list[JobView]) -> None:
    policy = make_policy("adaptive")
    first = policy.allocate(node, jobs)
    again = [JobView(**{**j.__dict__, "current": first[j.job_id]}) for j in jobs]
    assert policy.allocate(node, again) == first
