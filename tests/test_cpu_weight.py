"""CPU weights (JobAllocation.cpu_weight): written as v1 cpu.shares / v2 cpu.weight, reset on
release, applied by the reconciler only when they change, and really splitting a contended CPU."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from controller.backends.base import BackendError
from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.backends.cgroupfs import shares_of
from controller.policies.base import JobAllocation, NodeResources
from controller.reconciler import reconcile
from fixtures.cgroup2_tree import make_cgroup2_tree
from fixtures.cgroup_v1 import ROOT, needs_v1, remove_group, unique_group
from fixtures.processes import BUSY, Children, children  # noqa: F401


@pytest.fixture
def v1(children: Children) -> Iterator[CgroupV1Backend]:
    group = unique_group()
    yield CgroupV1Backend(group=group, root=ROOT)
    children.kill_all()
    remove_group(group)


def test_weights_map_onto_v1_shares() -> None:
    assert shares_of(None) == shares_of(100) == 1024
    assert shares_of(1) == 10 and shares_of(10_000) == 102_400
    for bad in (0, 10_001):
        with pytest.raises(BackendError, match="1-10000"):
            shares_of(bad)


@needs_v1
def test_v1_writes_cpu_shares_and_release_restores_the_default(v1: CgroupV1Backend) -> None:
    v1.create("job-a")
    shares = ROOT / "cpu" / v1.group / "job-a" / "cpu.shares"
    v1.set_cpu_weight("job-a", 250)
    assert shares.read_text().strip() == "2560"
    v1.release("job-a")
    assert shares.read_text().strip() == "1024"


def test_v2_writes_cpu_weight(tmp_path: Path) -> None:
    root = make_cgroup2_tree(tmp_path / "cg", "adloader", ["job-a"])
    backend = CgroupV2Backend(group="adloader", root=root)
    backend.set_cpu_weight("job-a", 37)
    assert (root / "adloader" / "job-a" / "cpu.weight").read_text() == "37"
    backend.release("job-a")
    assert (root / "adloader" / "job-a" / "cpu.weight").read_text() == "100"
    bare = CgroupV2Backend(group="adloader", root=make_cgroup2_tree(tmp_path / "bare", "adloader", ["j"], "io"))
    assert "cpu_weight" not in bare.capabilities


def test_the_reconciler_writes_a_weight_only_when_it_changes(tmp_path: Path) -> None:
    root = make_cgroup2_tree(tmp_path / "cg", "adloader", ["job-a"])
    backend = CgroupV2Backend(group="adloader", root=root)
    node = NodeResources(cpus=(0, 1))
    first = reconcile(backend, node, {"job-a": JobAllocation(cpu_weight=300)}, {})
    assert [(c.field, c.new) for c in first.changes if c.field == "cpu_weight"] == [("cpu_weight", 300)]
    again = reconcile(backend, node, {"job-a": JobAllocation(cpu_weight=300)}, first.applied)
    assert not [c for c in again.changes if c.field == "cpu_weight"]


@needs_v1
def test_weights_split_a_contended_cpu(v1: CgroupV1Backend, children: Children) -> None:
    spinners = {}
    for job, weight in (("heavy", 800), ("light", 100)):
        v1.create(job)
        v1.set_cpuset(job, (0,))  # both on one CPU, so they contend
        v1.set_cpu_weight(job, weight)
        spinners[job] = children.start(BUSY)
        v1.attach(job, spinners[job].pid)
    start = {job: v1.cpu_seconds(job) for job in spinners}
    time.sleep(1.5)
    used = {job: v1.cpu_seconds(job) - start[job] for job in spinners}
    assert all(psutil.pid_exists(p.pid) for p in spinners.values())
    # 8:1 by weight; generous, the machine is shared
    assert used["heavy"] > 3 * used["light"]
