"""The reconciler against real backends: a cgroup v2 fixture tree, real cgroup v1 groups, real processes.

Writes are counted by a thin subclass of the real backend that records each
setter call before doing it; everything else is the backend's own behaviour.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.backends.affinity import AffinityBackend
from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.policies.base import JobAllocation, NodeResources
from controller.reconciler import Change, reconcile
from fixtures.cgroup2_tree import make_cgroup2_tree
from fixtures.cgroup_v1 import ROOT as V1_ROOT, needs_v1, remove_group, unique_group
from fixtures.processes import SLEEP, Children, children  # noqa: F401

NODE = NodeResources(cpus=(0, 1), read_bps=200e6, read_device="254:0")
JOBS = ("job-a", "job-b")


def counting(backend_class: type) -> type:
    """``backend_class`` with a ``writes`` list of (job_id, field, value), one per setter call."""

    class Counting(backend_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.writes: list[tuple[str, str, Any]] = []

        def set_cpu_quota(self, job_id: str, cores: float | None) -> None:
            self.writes.append((job_id, "cores", cores))
            super().set_cpu_quota(job_id, cores)

        def set_cpuset(self, job_id: str, cpus: tuple[int, ...] | None) -> None:
            self.writes.append((job_id, "cpus", cpus))
            super().set_cpuset(job_id, cpus)

        def set_read_bps(self, job_id: str, device: str, bps: int | None) -> None:
            self.writes.append((job_id, "read_bps", bps))
            super().set_read_bps(job_id, device, bps)

    return Counting


@pytest.fixture
def v2(tmp_path: Path) -> Any:
    root = make_cgroup2_tree(tmp_path / "cgroup", "adloader", JOBS)
    backend = counting(CgroupV2Backend)(group="adloader", root=root)
    for job in JOBS:
        backend.create(job)
    return backend


@pytest.fixture(params=["cgroup-v2-fixture", pytest.param("cgroup-v1-kernel", marks=needs_v1)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "cgroup-v2-fixture":
        yield request.getfixturevalue("v2")
        return
    group = unique_group()
    backend = counting(CgroupV1Backend)(group=group, root=V1_ROOT)
    for job in JOBS:
        backend.create(job)
    yield backend
    remove_group(group)


def quota_of(backend: Any, job: str) -> str:
    if isinstance(backend, CgroupV2Backend):
        return (backend.root / backend.group / job / "cpu.max").read_text().split()[0]
    return (V1_ROOT / "cpu" / backend.group / job / "cpu.cfs_quota_us").read_text().strip()


WANTED = {
    "job-a": JobAllocation(cores=0.5, cpus=None, read_bps=5_000_000, workers=3),
    "job-b": JobAllocation(cores=1.25, cpus=(1,), read_bps=None, workers=2),
}


def test_first_pass_applies_every_field_and_an_unchanged_pass_writes_nothing(backend: Any) -> None:
    first = reconcile(backend, NODE, WANTED, {})
    assert first.failures == []
    assert set(first.changes) == {
        Change("job-a", "cores", None, 0.5),
        Change("job-a", "cpus", None, (0, 1)),  # no cpuset wanted: confined to the managed CPUs
        Change("job-a", "read_bps", None, 5_000_000),
        Change("job-b", "cores", None, 1.25),
        Change("job-b", "cpus", None, (1,)),
    }
    assert first.applied == {
        "job-a": JobAllocation(cores=0.5, cpus=(0, 1), read_bps=5_000_000, workers=3),
        "job-b": JobAllocation(cores=1.25, cpus=(1,), read_bps=None, workers=2),
    }
    assert quota_of(backend, "job-a") == "50000" and quota_of(backend, "job-b") == "125000"
    writes = len(backend.writes)
    assert writes == 5

    noisy = dict(WANTED, **{"job-a": JobAllocation(cores=0.5000001, cpus=None, read_bps=5_000_000, workers=3)})
    second = reconcile(backend, NODE, noisy, first.applied)
    assert second.changes == [] and second.failures == []
    assert second.applied == first.applied
    assert len(backend.writes) == writes, "an unchanged value was written again"


def test_only_the_field_that_changed_is_written(backend: Any) -> None:
    first = reconcile(backend, NODE, WANTED, {})
    before = len(backend.writes)
    wanted = dict(WANTED, **{"job-b": JobAllocation(cores=0.75, cpus=(1,), workers=4)})
    second = reconcile(backend, NODE, wanted, first.applied)
    assert second.changes == [Change("job-b", "cores", 1.25, 0.75)]
    assert backend.writes[before:] == [("job-b", "cores", 0.75)]
    assert second.applied["job-b"] == JobAllocation(cores=0.75, cpus=(1,), workers=4)
    assert quota_of(backend, "job-b") == "75000"


def test_one_jobs_failure_spares_the_others_and_is_retried_next_period(backend: Any, tmp_path: Path) -> None:
    wanted = dict(WANTED, **{"job-x": JobAllocation(cores=0.5, workers=1)})  # its group does not exist yet
    first = reconcile(backend, NODE, wanted, {})
    assert {(f.job_id, f.field) for f in first.failures} == {("job-x", "cores"), ("job-x", "cpus")}
    assert all("job-x" in f.error for f in first.failures)
    assert {c.job_id for c in first.changes} == {"job-a", "job-b"}
    assert first.applied["job-x"] == JobAllocation(workers=1), "a failed field must keep its old value"

    if isinstance(backend, CgroupV2Backend):
        make_cgroup2_tree(backend.root, backend.group, ["job-x"])
    backend.create("job-x")
    second = reconcile(backend, NODE, wanted, first.applied)
    assert second.failures == []
    assert set(second.changes) == {Change("job-x", "cores", None, 0.5), Change("job-x", "cpus", None, (0, 1))}


def test_unenforceable_fields_are_skipped_not_failed(children: Children) -> None:
    backend = counting(AffinityBackend)()
    backend.create("job-a")
    backend.attach("job-a", children.start(SLEEP).pid)
    node = NodeResources(cpus=(0,), read_bps=1e8, read_device="254:0")
    result = reconcile(backend, node, {"job-a": JobAllocation(cores=0.5, read_bps=1000, workers=2)}, {})
    assert result.failures == []
    assert result.changes == [Change("job-a", "cpus", None, (0,))]
    assert result.applied == {"job-a": JobAllocation(cores=None, cpus=(0,), read_bps=None, workers=2)}
    assert backend.writes == [("job-a", "cpus", (0,))]


def test_no_read_device_means_read_bandwidth_is_not_managed(v2: Any) -> None:
    node = NodeResources(cpus=(0, 1))
    result = reconcile(v2, node, {"job-a": JobAllocation(read_bps=5_000_000)}, {})
    assert [w[1] for w in v2.writes] == ["cpus"]
    assert result.applied["job-a"].read_bps is None


def test_jobs_no_longer_wanted_leave_applied_untouched(v2: Any) -> None:
    applied = {"gone": JobAllocation(cores=1.0, cpus=(0,))}
    result = reconcile(v2, NODE, {}, applied)
    assert result.applied == {} and result.changes == [] and v2.writes == []


def test_removing_a_limit_writes_the_unlimited_value(v2: Any) -> None:
    first = reconcile(v2, NODE, {"job-a": JobAllocation(cores=0.5, read_bps=1000)}, {})
    second = reconcile(v2, NODE, {"job-a": JobAllocation()}, first.applied)
    assert set(second.changes) == {Change("job-a", "cores", 0.5, None), Change("job-a", "read_bps", 1000, None)}
    assert (v2.root / "adloader" / "job-a" / "cpu.max").read_text() == "max 100000"
    assert (v2.root / "adloader" / "job-a" / "io.max").read_text() == "254:0 rbps=max"
