"""Training processes apart from their job's CPU group (controller/training_processes.py).

A rank whose loader runs workers leaves the job's cpu/cpuacct groups (its cpuset and read
throttles still hold it), what it forks is moved back in, and a rank that loads in its own
process returns. Real cgroup v1 groups and real processes; the last test runs a real
controller and a real ``adloader run`` job with adloader's DataLoader.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from bench.controller_process import ControllerProcess, wait_until
from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.backends.placement import cgroups_of
from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.peer import peer_belongs_to_job
from controller.processes import ancestors, children_of, start_time
from controller.training_processes import TrainingProcesses
from fixtures.cgroup2_tree import make_cgroup2_tree
from fixtures.cgroup_v1 import ROOT, needs_v1, remove_group, unique_group
from fixtures.processes import FORK_ON_GO, Children, children, fork_after_go  # noqa: F401 (fixture)

LOADER_JOB = Path(__file__).parent / "loader_job.py"


@pytest.fixture
def v1_job(children: Children):  # noqa: F811
    group = unique_group()
    backend = CgroupV1Backend(group=group, root=ROOT)
    backend.create("job")
    rank = children.start(FORK_ON_GO)
    backend.attach("job", rank.pid)
    try:
        yield backend, rank, f"/{group}/job"
    finally:
        children.kill_all()
        remove_group(group)


@needs_v1
def test_a_rank_with_workers_leaves_the_cpu_group_and_what_it_forks_is_moved_back(v1_job) -> None:
    backend, rank, job_path = v1_job
    training = TrainingProcesses(backend)

    training.reported("job", rank.pid, running_workers=0, batches=0)
    assert training.place("job", backend.pids("job")) == {rank.pid}
    assert cgroups_of(rank.pid)["cpu"] == job_path  # no workers yet: it stays
    assert not training.regrouped("job")

    training.reported("job", rank.pid, running_workers=2, batches=4)
    assert training.place("job", backend.pids("job")) == {rank.pid}
    assert training.apart("job") == 1 and training.regrouped("job")  # the group's CPU is its loaders' from here
    paths = cgroups_of(rank.pid)
    assert (paths["cpu"], paths["cpuacct"]) == ("/", "/")  # back where it came from: the root here
    assert (paths["cpuset"], paths["blkio"]) == (job_path, job_path)  # the job's CPUs and throttles still hold it
    assert backend.pids("job") == set()

    child = fork_after_go(rank)  # the helper its loader forks workers from
    assert cgroups_of(child)["cpu"] == "/"  # born where the rank is
    assert training.place("job", backend.pids("job")) == {rank.pid, child}
    assert cgroups_of(child)["cpu"] == job_path
    assert backend.pids("job") == {child}
    assert not training.regrouped("job")  # its child joined the loaders: no rank moved


@needs_v1
def test_a_rank_that_loads_in_its_own_process_returns_and_one_between_epochs_does_not(v1_job) -> None:
    backend, rank, job_path = v1_job
    training = TrainingProcesses(backend)
    training.reported("job", rank.pid, running_workers=3, batches=10)
    training.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == "/"

    training.reported("job", rank.pid, running_workers=0, batches=10)  # between epochs: no batch, no worker
    training.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == "/"

    training.reported("job", rank.pid, running_workers=0, batches=25)  # its workers' last batches, or its own?
    training.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == "/"

    training.reported("job", rank.pid, running_workers=0, batches=40)  # batches again without workers: it loads
    training.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == job_path
    assert not training.regrouped("job")  # what it uses in the group now is loading

    training.reported("job", rank.pid, running_workers=2, batches=50)  # workers again (an evaluation's end)
    training.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == "/" and not training.regrouped("job")  # its start-up is long past

    restarted = TrainingProcesses(backend)  # a controller restarted finds the rank outside already
    restarted.reported("job", rank.pid, running_workers=2, batches=60)
    restarted.place("job", backend.pids("job"))
    for batches in (70, 80):
        restarted.reported("job", rank.pid, running_workers=0, batches=batches)
        restarted.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == job_path
    restarted.reported("job", rank.pid, running_workers=2, batches=90)
    restarted.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == "/" and not restarted.regrouped("job")


@needs_v1
def test_with_loaders_leaves_every_process_in_the_group_and_a_gone_rank_is_forgotten(v1_job) -> None:
    backend, rank, job_path = v1_job
    kept = TrainingProcesses(backend, mode="with-loaders")
    kept.reported("job", rank.pid, running_workers=2, batches=4)
    kept.place("job", backend.pids("job"))
    assert cgroups_of(rank.pid)["cpu"] == job_path

    training = TrainingProcesses(backend)
    training.reported("job", rank.pid, running_workers=2, batches=4)
    assert training.place("job", backend.pids("job")) == {rank.pid}
    rank.kill()
    rank.wait()
    assert training.place("job", backend.pids("job")) == set()


def test_a_mode_that_does_not_exist_is_refused_with_the_choices(tmp_path: Path) -> None:
    from controller.backends.affinity import AffinityBackend

    with pytest.raises(ValueError, match="apart, with-loaders"):
        TrainingProcesses(AffinityBackend(), mode="apart-ish")
    assert not TrainingProcesses(AffinityBackend()).enabled  # no groups: a job's processes are its launcher's tree


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_children_are_read_from_every_thread(tmp_path: Path) -> None:
    _write(tmp_path / "300" / "task" / "300" / "children", "301 302 ")
    _write(tmp_path / "300" / "task" / "305" / "children", "303\n")
    _write(tmp_path / "300" / "task" / "306" / "children", "")
    assert children_of(300, tmp_path) == {301, 302, 303}
    assert children_of(999, tmp_path) == set()


def _stat(pid: int, parent: int, started: int) -> str:
    """A /proc/PID/stat line: pid (comm) state ppid, then fields 5-21, then the start time (22)."""
    return f"{pid} (python3) S {parent} " + " ".join(["0"] * 17) + f" {started} 0 0\n"


def test_a_pid_taken_by_another_process_is_never_moved(tmp_path: Path) -> None:
    """The rank exited and its pid now names another process: the controller forgets the rank
    and leaves that process where it is (cgroup v2 fixture tree and /proc)."""
    proc = tmp_path / "proc"
    root = make_cgroup2_tree(tmp_path / "cgroup", "adloader", [])
    backend = CgroupV2Backend(root=root, proc=proc)
    backend.create("job")
    _write(proc / "300" / "stat", _stat(300, 200, started=1000))
    assert start_time(300, proc) == 1000
    training = TrainingProcesses(backend, proc=proc)
    training.reported("job", 300, running_workers=2, batches=4)
    assert training.place("job", {300}) == {300}
    assert (root / "cgroup.procs").read_text() == "300"  # detached: to the root on a bare node

    (root / "cgroup.procs").write_text("")
    _write(proc / "300" / "stat", _stat(300, 1, started=5000))  # another process, the same pid
    assert training.place("job", {300}) == {300}  # the group's own pids, nothing added
    assert (root / "cgroup.procs").read_text() == ""  # and nothing moved


def test_a_rank_apart_belongs_to_its_job_through_its_launcher(tmp_path: Path) -> None:
    """A command name may hold spaces and parentheses: the parent pid is read after the last ')'."""
    _write(tmp_path / "300" / "stat", "300 (py (x) y) S 200 300 300 0 -1\n")
    _write(tmp_path / "200" / "stat", "200 (adloader run) S 100 200 200 0 -1\n")
    _write(tmp_path / "100" / "stat", "100 (bash) S 1 100 100 0 -1\n")
    assert ancestors(300, tmp_path) == [200, 100]
    assert peer_belongs_to_job(300, "job", "adloader", lambda _: {200}, tmp_path)
    assert not peer_belongs_to_job(300, "job", "adloader", lambda _: {999}, tmp_path)


@pytest.mark.parametrize(
    ("mode", "policy", "workers", "rank_apart"),
    [("apart", "adaptive", 2, True), ("with-loaders", "adaptive", 2, False), ("apart", "static", 0, False)],
    ids=["apart", "with-loaders", "no-workers"],
)
def test_the_controller_keeps_a_jobs_rank_apart_from_its_workers(
    start_controller: Callable[..., ControllerProcess], tmp_path: Path, mode: str, policy: str, workers: int,
    rank_apart: bool,
) -> None:
    """``static`` leaves a job the workers it asked for: none, so its rank loads and stays in the group."""
    controller = start_controller("--policy", policy, "--cpus", "0", "--training-processes", mode)
    stop = tmp_path / "stop"
    job = controller.run(sys.executable, str(LOADER_JOB), "--out", str(tmp_path / "out"), "--workers", str(workers),
                         "--seconds", "120", "--stop-file", str(stop), "--samples", "200", "--compute-s", "0.02",
                         name="apart")
    snapshot = controller.registered(job)
    launcher = snapshot.launcher_pid

    def rank_pid() -> int | None:
        ranks = children_of(launcher)
        return next(iter(ranks)) if ranks else None

    rank = wait_until(rank_pid, 30, "the training process to start")

    def reported() -> bool:
        job_now = next(j for j in controller.status().jobs if j.job_id == snapshot.job_id)
        return job_now.samples_total > 0 and job_now.workers_running >= min(workers, 1)

    wait_until(reported, 60, "the job to report loading")
    time.sleep(1.5)  # a control step after its reports (period 0.5 s)
    job_path = snapshot.cgroups["cpu"]
    in_group = cgroups_of(rank)["cpu"] == job_path
    assert in_group is not rank_apart
    loaders = {grandchild for child in children_of(rank) for grandchild in children_of(child) | {child}}
    assert len(loaders) >= (2 if workers else 0)  # the helper and at least one worker
    assert all(cgroups_of(pid)["cpu"] == job_path for pid in loaders)  # every loader shares the job's weight
    job_now = next(j for j in controller.status().jobs if j.job_id == snapshot.job_id)
    assert rank in job_now.pids
    assert job_now.training_processes_apart == (1 if rank_apart else 0)
    stop.touch()
    assert job.wait(60) == 0


RANK_STARTS_RANK = """
import os, sys, time

def hold():
    time.sleep(120)
    os._exit(0)

def say(*words):  # one write: lines from several processes never interleave
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())

def load(role):  # an epoch's loader: a helper that forks a worker, as the loader's spawner does
    helper = os.fork()
    if helper == 0:
        worker = os.fork()
        if worker == 0:
            hold()
        say(role, "worker", worker)
        hold()
    say(role, "helper", helper)

to_rank1 = None
for command in iter(sys.stdin.readline, ""):
    if command == "rank\\n":  # the framework starts rank 1 as this rank's child (Lightning's DDP launcher)
        r, to_rank1 = os.pipe()
        rank1 = os.fork()
        if rank1 == 0:
            os.close(to_rank1)
            for _ in iter(os.fdopen(r).readline, ""):
                load("rank1")
            hold()
        os.close(r)
        say("rank1 rank", rank1)
    else:
        load("rank0")
        if to_rank1 is not None:
            os.write(to_rank1, b"load\\n")
hold()
"""
"""Rank 0: on "rank", starts rank 1 as its child; on "load", starts an epoch's loader
(helper and worker) in itself and in rank 1. Prints "<rank> <role> <pid>" for each process."""


class CountedMoves(CgroupV1Backend):
    """The cgroup v1 backend, counting every process it moves."""

    moves = 0

    def attach(self, job_id: str, pid: int) -> None:
        self.moves += 1
        super().attach(job_id, pid)

    def detach(self, job_id: str, pid: int) -> None:
        self.moves += 1
        super().detach(job_id, pid)


def _command(process, command: str, lines: int) -> dict[tuple[str, str], int]:
    """Send a command to RANK_STARTS_RANK; {(rank, role): pid} from the lines it prints."""
    process.stdin.write(command + "\n")
    process.stdin.flush()
    printed = [process.stdout.readline().split() for _ in range(lines)]
    assert all(len(line) == 3 for line in printed), printed
    return {(rank, role): int(pid) for rank, role, pid in printed}


@needs_v1
def test_a_rank_started_as_another_ranks_child_stays_apart_and_only_loaders_are_moved_back(
    children: Children,  # noqa: F811
) -> None:
    group = unique_group()
    backend = CountedMoves(group=group, root=ROOT)
    backend.create("job")
    rank0 = children.start(RANK_STARTS_RANK)
    backend.attach("job", rank0.pid)
    backend.moves = 0
    job_path = f"/{group}/job"
    training = TrainingProcesses(backend)
    try:
        loaders = _command(rank0, "load", 2)  # rank 0's first epoch, born in the job's group
        training.reported("job", rank0.pid, running_workers=1, batches=4, loader_pids=loaders.values())
        training.place("job", backend.pids("job"))
        assert cgroups_of(rank0.pid)["cpu"] == "/" and backend.moves == 1

        rank1 = _command(rank0, "rank", 1)[("rank1", "rank")]  # born where rank 0 is: outside
        training.place("job", backend.pids("job"))  # before rank 1 has reported even once
        assert cgroups_of(rank1)["cpu"] == "/", "rank 1 was taken for one of rank 0's loaders"

        epoch = _command(rank0, "load", 4)  # each rank's next epoch: born outside, with their rank
        every_loader = {*loaders.values(), *epoch.values()}
        for step in range(6):
            for rank, pid in (("rank0", rank0.pid), ("rank1", rank1)):
                training.reported("job", pid, running_workers=1, batches=10 * (step + 1),
                                  loader_pids=[p for (r, _), p in epoch.items() if r == rank])
            processes = training.place("job", backend.pids("job"))
            assert {p: cgroups_of(p)["cpu"] for p in (rank0.pid, rank1)} == {rank0.pid: "/", rank1: "/"}
            assert {cgroups_of(p)["cpu"] for p in every_loader} == {job_path}, "every loader shares the job's weight"
            assert processes == {rank0.pid, rank1, *every_loader}
            assert training.apart("job") == 2
        assert backend.moves == 1 + 4, "rank 0 out once, the second epoch's loaders in once each: no flapping"
    finally:
        children.kill_all()
        remove_group(group)


@needs_v1
def test_a_rank_whose_library_names_no_loaders_has_its_children_moved_but_not_its_child_ranks(
    children: Children,  # noqa: F811
) -> None:
    """An older library's reports (no ``loader_pids``): the rank's children are moved back,
    all but those that report as ranks."""
    group = unique_group()
    backend = CountedMoves(group=group, root=ROOT)
    backend.create("job")
    rank0 = children.start(RANK_STARTS_RANK)
    backend.attach("job", rank0.pid)
    training = TrainingProcesses(backend)
    try:
        training.reported("job", rank0.pid, running_workers=1, batches=4)
        training.place("job", backend.pids("job"))
        rank1 = _command(rank0, "rank", 1)[("rank1", "rank")]
        training.reported("job", rank1, running_workers=1, batches=4)
        training.place("job", backend.pids("job"))
        loaders = _command(rank0, "load", 4)
        moves = backend.moves
        for step in range(4):
            for pid in (rank0.pid, rank1):
                training.reported("job", pid, running_workers=1, batches=10 * (step + 1))
            training.place("job", backend.pids("job"))
            assert (cgroups_of(rank0.pid)["cpu"], cgroups_of(rank1)["cpu"]) == ("/", "/")
        helpers = [loaders[("rank0", "helper")], loaders[("rank1", "helper")]]
        assert {cgroups_of(p)["cpu"] for p in helpers} == {job_path := f"/{group}/job"}, job_path
        assert backend.moves == moves + 2, "each rank's helper, once"
    finally:
        children.kill_all()
        remove_group(group)
