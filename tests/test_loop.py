"""One control step against the real cgroup v1 backend: decisions are logged once with their
reason, reallocations are counted by reason, the kernel gets only what changed, and one
job's backend failure leaves the others applied."""
from __future__ import annotations

import logging
import uuid
from typing import Iterator

import pytest

from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.loop import ControlLoop, describe_change
from controller.policies import JobAllocation, NodeResources, make_policy
from controller.registry import Registry
from controller.training_processes import TrainingProcesses
from fixtures.processes import FORK_ON_GO, Children, children  # noqa: F401 (fixture)
from bench.controller_process import CGROUP_ROOT, remove_group
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1

pytestmark = pytest.mark.skipif(not CGROUP_V1_USABLE, reason=NO_CGROUP_V1)
NODE = NodeResources(cpus=(0,))


@pytest.fixture
def backend() -> Iterator[CgroupV1Backend]:
    group = f"adloader-test-{uuid.uuid4().hex[:8]}"
    yield CgroupV1Backend(group=group, root=CGROUP_ROOT)
    remove_group(group)


def _add(registry: Registry, backend: CgroupV1Backend, job_id: str) -> None:
    registry.register(job_id, name=f"name-{job_id}", uid=0, gpus=1, launcher_pid=1, cgroup=backend.create(job_id))


def _quota(backend: CgroupV1Backend, job_id: str) -> int:
    return int((CGROUP_ROOT / "cpu" / backend.group / job_id / "cpu.cfs_quota_us").read_text())


def _decisions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "controller.loop" and r.levelno == logging.INFO]


def test_decisions_are_logged_once_with_their_reason_and_counted(
    backend: CgroupV1Backend, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    loop = ControlLoop(backend, NODE, make_policy("even"))
    caplog.set_level(logging.INFO)
    _add(registry, backend, "a")
    outcome = loop.step(registry, {"arrival"})
    assert outcome.reason == "arrival" and _quota(backend, "a") == 100_000
    assert _decisions(caplog) == ["job a (name-a): cores unset -> 1.00, cpus unset -> 0, workers unset -> 1 "
                                  "(policy even, reason: arrival)"]
    caplog.clear()
    steady = loop.step(registry)
    assert steady.reason is None and steady.changes == [] and _decisions(caplog) == []

    _add(registry, backend, "b")
    loop.step(registry, {"arrival"})
    assert [_quota(backend, j) for j in "ab"] == [50_000, 50_000]
    assert len(_decisions(caplog)) == 2
    registry.remove("b", pids=set(), cpu_seconds=0.0)
    loop.forget("b")
    caplog.clear()
    assert loop.step(registry, {"departure"}).reason == "departure"
    assert _decisions(caplog) == ["job a (name-a): cores 0.50 -> 1.00 (policy even, reason: departure)"]
    loop.policy = make_policy("static")
    assert loop.step(registry, {"policy_change"}).reason == "policy_change"
    assert _quota(backend, "a") == -1
    assert dict(loop.reallocations) == {"arrival": 2, "departure": 1, "policy_change": 1}


def test_a_rank_moved_out_of_its_group_restarts_the_jobs_cpu_reading_and_loading_curve(
    backend: CgroupV1Backend, children: Children,  # noqa: F811
) -> None:
    """The step that moves a training process out of its job's group (training_processes.py)
    tells the registry: the group's CPU until then was the rank's start-up as well."""
    registry = Registry()
    training = TrainingProcesses(backend)
    loop = ControlLoop(backend, NODE, make_policy("adaptive"), training=training)
    _add(registry, backend, "a")
    rank = children.start(FORK_ON_GO)
    backend.attach("a", rank.pid)
    job = registry.get("a")
    assert job is not None
    for _ in range(6):
        job.loading_curve.observe(1.0, 100.0)
    loop.step(registry, {"arrival"})
    assert job.loading_curve.observations > 0 and job.cpu_samples  # no workers reported: the rank stays
    training.reported("a", rank.pid, running_workers=2, batches=4)
    loop.step(registry)
    assert rank.pid not in backend.pids("a")
    assert job.loading_curve.observations == 0 and not job.cpu_samples
    job.loading_curve.observe(0.5, 100.0)
    loop.step(registry)  # nothing moves: what is learnt from here stays
    assert job.loading_curve.observations == 1 and job.cpu_samples


def test_an_adopted_job_gets_its_limits_written_again_at_the_first_step(
    backend: CgroupV1Backend, caplog: pytest.LogCaptureFixture,
) -> None:
    before = Registry()
    first = ControlLoop(backend, NODE, make_policy("even"))
    _add(before, backend, "a")
    first.step(before, {"arrival"})
    (CGROUP_ROOT / "cpu" / backend.group / "a" / "cpu.cfs_quota_us").write_text("-1")  # lost meanwhile

    after = Registry()
    saved = before.persisted(first.allocations)["a"]
    after.adopt(saved)
    restarted = ControlLoop(backend, NODE, make_policy("even"))
    restarted.allocations.restore("a", saved.wanted, saved.applied)
    caplog.set_level(logging.INFO)
    assert restarted.step(after, {"adoption"}).reason == "adoption"
    assert _quota(backend, "a") == 100_000
    assert _decisions(caplog) == ["job a (name-a): cores unset -> 1.00, cpus unset -> 0, workers unset -> 1 "
                                  "(policy even, reason: adoption)"]


def test_a_job_whose_group_is_missing_fails_alone_and_is_retried(backend: CgroupV1Backend) -> None:
    registry = Registry()
    loop = ControlLoop(backend, NODE, make_policy("even"))
    _add(registry, backend, "a")
    registry.register("ghost", name="ghost", uid=0, gpus=1, launcher_pid=1, cgroup="")  # no group made
    outcome = loop.step(registry, {"arrival"})
    assert {f.job_id for f in outcome.failures} == {"ghost"} and _quota(backend, "a") == 50_000
    assert loop.backend_failures == len(outcome.failures)
    backend.create("ghost")
    retried = loop.step(registry)
    assert retried.failures == [] and _quota(backend, "ghost") == 50_000


def test_describe_change_names_only_the_fields_that_differ() -> None:
    old = JobAllocation(cores=2.0, cpus=(0, 1, 2, 3), read_bps=50_000_000, workers=4)
    assert describe_change(old, JobAllocation(cores=1.5, cpus=(0, 1, 2, 3), read_bps=None, workers=4)) == (
        "cores 2.00 -> 1.50, read_bps 50.0MB/s -> unset")
    assert describe_change(old, old) == "unchanged"
