"""An operator's pin of a job's workers (``adloader workers JOB N|auto``): the override laid over
the policy's allocation (pure), and the whole request in an in-process controller on the cgroup
v2 fixture tree: who may pin, what is refused and why, the target and its reason, status, the
state file across a restart, and ``auto``. The same pins moving real programs' workers live:
tests/test_unchanged_programs.py; another uid refused over the real socket: tests/test_authz.py.
The command's usage errors: one plain line each."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from adloader import protocol
from adloader.status import render_table
from bench.controller_process import REPO, base_environment
from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.daemon import Controller, ControllerConfig
from controller.peer import PeerCredentials
from controller.policies import JobAllocation, NodeResources
from controller.policies.base import JobView
from controller.server import Connection, RequestRefused
from controller.state import STATE_VERSION, ControllerState, PersistedJob, StateStore
from controller.target_reason import target_reason
from controller.worker_pins import apply_pins
from fixtures.cgroup2_tree import make_cgroup2_tree

pytestmark = pytest.mark.in_process  # the heaviest test here builds a controller on a fixture tree

NODE = NodeResources(cpus=(0, 1), max_workers_per_job=8)
POLICY = JobAllocation(cores=1.5, cpu_weight=300, cpus=(0, 1), read_bps=10**8, workers=2)


def test_a_pin_replaces_only_the_workers_split_over_the_ranks_within_the_memory_cap() -> None:
    views = [JobView(job_id="one", name="one", ranks=1), JobView(job_id="two", name="two", ranks=2),
             JobView(job_id="tight", name="tight", ranks=2, max_workers=2),
             JobView(job_id="free", name="free"), JobView(job_id="dark", name="dark", unmanaged=True)]
    wanted = {view.job_id: POLICY for view in views}
    pinned = apply_pins(NODE, views, wanted, {"one": 3, "two": 7, "tight": 12, "dark": 4, "gone": 5})
    assert pinned == {
        "one": replace(POLICY, workers=3),  # cores, weight, cpus and bandwidth stay the policy's
        "two": replace(POLICY, workers=3),  # 7 over 2 ranks: an even split, 3 a rank
        "tight": replace(POLICY, workers=2),  # 6 a rank asked, its memory holds 2 a rank
        "free": POLICY, "dark": POLICY,  # not pinned; unmanaged: no loader of ours to pin
    }
    assert apply_pins(NODE, views[:1], {"one": POLICY}, {"one": 100}) == {"one": replace(POLICY, workers=8)}  # node cap
    assert apply_pins(NODE, views[1:2], {"two": POLICY}, {"two": 1}) == {"two": replace(POLICY, workers=1)}  # >= 1


def test_the_target_reason_names_the_pin_and_what_holds_the_job_below_it() -> None:
    assert target_reason("even", replace(POLICY, workers=3), 2, None, pinned=6) == \
        "an operator pinned this job's workers to 6 in all (adloader workers)"
    assert target_reason("even", replace(POLICY, workers=2), 2, 4, pinned=6) == \
        ("an operator pinned this job's workers to 6 in all (adloader workers), but the job's memory and the "
         "node's memory reserve hold 4 workers in all")
    assert target_reason("even", replace(POLICY, workers=1), 1, None, pinned=3).endswith(
        "it gets 1 a rank until its workers' memory is measured")
    assert target_reason("even", POLICY, 1, None) == \
        "the even policy gives this job 1.5 cores (a CPU quota), and workers follow cores"


OWNER, OTHER = 4242, 4343
JOBS = ("j2000000a", "j2000000b")


def _controller(tmp_path: Path) -> Controller:
    """A controller that will adopt JOBS (owned by OWNER, asking 4 workers a rank) from its state file."""
    root = tmp_path / "cg"
    if not root.exists():
        make_cgroup2_tree(root, "adloader", JOBS)
        for job_id in JOBS:  # a live process in each job's group: this test process
            (root / "adloader" / job_id / "cgroup.procs").write_text(f"{os.getpid()}\n")
        StateStore(tmp_path / "state").save(ControllerState(version=STATE_VERSION, policy="even", saved_at=0.0, jobs={
            job_id: PersistedJob(job_id=job_id, name=f"train-{job_id[-1]}", uid=OWNER, gpus=1,
                                 launcher_pid=os.getpid(), registered_at=1.7e9, cgroup="", wanted=JobAllocation(),
                                 applied=JobAllocation(), requested_workers=4, features=None)
            for job_id in JOBS}))
    config = ControllerConfig(socket_path=tmp_path / "s.sock", state_dir=tmp_path / "state", cpus=(0, 1),
                              policy="even", group="adloader", cgroup_root=root, lock_dir=tmp_path / "locks",
                              # The reports come from this test process: kept apart, its children (whatever
                              # earlier tests of the session left it) would be moved into the fake groups in
                              # its place, and its next report refused.
                              training_processes="with-loaders")
    controller = Controller(config, backend=CgroupV2Backend(group="adloader", root=root))
    controller.recover()
    return controller


def _as(uid: int) -> Connection:
    return Connection(peer=PeerCredentials(pid=os.getpid(), uid=uid, gid=uid))


def _refusal(controller: Controller, uid: int, job_id: str, workers: int | None) -> tuple[str, str]:
    with pytest.raises(RequestRefused) as refused:
        controller.handle(protocol.SetWorkers(job_id=job_id, num_workers=workers), _as(uid))
    return refused.value.code, refused.value.message


def _target(controller: Controller, job_id: str) -> protocol.Target:
    reply = controller.handle(protocol.Report(job_id=job_id, batch_size=8, samples=8, num_workers=1), _as(0))
    assert isinstance(reply, protocol.Target)
    return reply


def test_the_owner_or_root_pins_a_jobs_workers_over_the_policy_and_it_survives_a_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pinned, other = JOBS
    controller = _controller(tmp_path)
    controller.step()
    policy = {job: controller.loop.allocations.get(job).wanted for job in JOBS}
    assert policy[pinned] == policy[other] and policy[pinned].workers == 1  # even: 1 core each, 1 worker

    code, message = _refusal(controller, OWNER, "j-nope", 3)
    assert code == "unknown_job" and "'adloader status' lists the jobs" in message
    assert _refusal(controller, OTHER, pinned, 3) == (
        "forbidden", f"job {pinned} belongs to uid {OWNER}; only it or root may change its workers")
    code, message = _refusal(controller, OWNER, pinned, 33)
    assert code == "bad_workers" and "at most 32 workers" in message and "'auto'" in message

    with caplog.at_level(logging.INFO, logger="controller.daemon"):
        assert controller.handle(protocol.SetWorkers(job_id=pinned, num_workers=3), _as(OWNER)) == protocol.Ok()
        controller.handle(protocol.SetWorkers(job_id=pinned, num_workers=3), _as(OWNER))  # again: no new line
    assert [r.getMessage() for r in caplog.records if "pinned" in r.getMessage()] == [
        f"job {pinned} (train-a): workers pinned to 3 in all by uid {OWNER} (pid {os.getpid()})"]
    controller.step()
    assert controller.loop.allocations.get(pinned).wanted == replace(policy[pinned], workers=3)
    assert controller.loop.allocations.get(other).wanted == policy[other]
    assert controller.loop.reallocations["workers_pinned"] == 1
    assert _target(controller, pinned) == protocol.Target(
        num_workers=3, reason="an operator pinned this job's workers to 3 in all (adloader workers)")

    assert controller.handle(protocol.SetWorkers(job_id=pinned, num_workers=6), _as(0)) == protocol.Ok()  # root
    controller.step()  # 6 asked, 4 a rank until its workers' memory is measured (what it asked for)
    target = _target(controller, pinned)
    assert target.num_workers == 4 and target.reason.endswith("it gets 4 a rank until its workers' memory is measured")
    shown = {job.job_id: job for job in controller.snapshot().jobs}
    assert (shown[pinned].workers_pinned, shown[other].workers_pinned) == (6, None)
    table = render_table(controller.snapshot(), 0.0)
    assert " 1/4 pinned " in table  # WORKERS: running (its last report) / target, pinned
    assert f"= train-a ({pinned}): workers pinned to 6 in all (target 4: an even split" in table
    assert f"'adloader workers {pinned} auto'" in table
    controller.save()

    restarted = _controller(tmp_path)  # the pin is in the state file: a new controller keeps it
    restarted.step()
    assert restarted.loop.allocations.get(pinned).wanted.workers == 4
    assert restarted.handle(protocol.SetWorkers(job_id=pinned, num_workers=None), _as(OWNER)) == protocol.Ok()
    restarted.step()
    assert restarted.loop.allocations.get(pinned).wanted == policy[pinned]
    assert {job.workers_pinned for job in restarted.snapshot().jobs} == {None}


@pytest.mark.parametrize(("args", "says"), [
    (["j1", "zero"], "adloader workers: 'zero' is not a number of workers: give a whole number from 1, or 'auto'"),
    (["j1", "0"], "adloader workers: '0' is not a number of workers: give a whole number from 1, or 'auto'"),
    (["j1", "auto", "--socket", "/nonexistent/adloader.sock"], "adloader workers: no controller at "),
])
def test_the_command_says_what_is_wrong_in_one_plain_line(args: list[str], says: str) -> None:
    result = subprocess.run([sys.executable, "-m", "adloader", "workers", *args], capture_output=True, text=True,
                            timeout=60, cwd=REPO, env=base_environment())
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(says), result.stderr
