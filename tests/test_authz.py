"""Who may do what on the controller's socket, tried by real unprivileged users.

Two system users are created for the session (``useradd --system``, removed at the
end). Their processes are forked from the test and drop root (the interpreter lives
under /root, which they could not exec); a process that registers is moved into its
job's cgroup by the controller, exactly as a launcher is, and later requests go on
fresh connections, as a rank's loader would. docs/operations.md "The socket and who
may do what" is the specification checked here.
"""
from __future__ import annotations

import multiprocessing
import os
import pwd
import socket
import stat
import subprocess
import sys
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Iterator

import pytest

from adloader import protocol
from adloader.client import ControllerClient
from adloader.protocol import NodeSnapshot
from controller.server import SocketInUse, prepare_socket_path
from bench.controller_process import REPO, ControllerProcess, base_environment, wait_until

Reply = tuple[str, "str | None"]


def _agent_main(pipe: Connection, socket_path: str, uid: int, gid: int, job_name: str | None) -> None:
    """In the forked child: become ``uid``, register a job if asked (which puts this process
    in its cgroup), then send each message the test passes on a fresh connection."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    launcher = ControllerClient(socket_path)
    registered = launcher.request_raw(protocol.encode(protocol.Register(name=job_name))) if job_name else None
    pipe.send(getattr(registered, "job_id", None))
    while (message := pipe.recv()) is not None:
        with ControllerClient(socket_path) as client:
            reply = client.request_raw(protocol.encode(message))
        pipe.send((reply.TYPE, getattr(reply, "code", None)))
    launcher.close()


class Agent:
    """A real process running as another user, optionally in a job of its own."""

    def __init__(self, controller: ControllerProcess, user: pwd.struct_passwd, job_name: str | None = None) -> None:
        context = multiprocessing.get_context("fork")
        self._pipe, child = context.Pipe()
        self.process = context.Process(
            target=_agent_main, args=(child, str(controller.socket), user.pw_uid, user.pw_gid, job_name), daemon=True
        )
        self.process.start()
        self.job_id: str | None = self._pipe.recv()

    def ask(self, message: protocol.Message) -> Reply:
        self._pipe.send(message)
        return self._pipe.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self._pipe.send(None)
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


@pytest.fixture
def agents(controller: ControllerProcess) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def start(user: pwd.struct_passwd, job_name: str | None = None) -> Agent:
        agent = Agent(controller, user, job_name)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


def _reply(controller: ControllerProcess, message: protocol.Message) -> Reply:
    reply = controller.request(message)
    return reply.TYPE, getattr(reply, "code", None)


def test_a_process_in_one_job_reports_and_acts_only_for_its_own(
    controller: ControllerProcess, users: tuple[pwd.struct_passwd, pwd.struct_passwd], agents: Callable[..., Agent],
) -> None:
    alice, bob = users
    in_a, in_b = agents(alice, "job-a"), agents(bob, "job-b")
    also_alice, alice_outside = agents(alice, "job-a2"), agents(alice)
    assert in_a.job_id and in_b.job_id and also_alice.job_id and alice_outside.job_id is None
    owners = {j.job_id: j.uid for j in controller.status().jobs}
    assert owners == {in_a.job_id: alice.pw_uid, in_b.job_id: bob.pw_uid, also_alice.job_id: alice.pw_uid}

    assert in_a.ask(protocol.Report(job_id=in_a.job_id, samples=32)) == ("target", None)
    assert in_a.ask(protocol.Report(job_id=in_b.job_id, samples=32)) == ("error", "forbidden")
    assert in_a.ask(protocol.Report(job_id=also_alice.job_id, samples=32)) == ("error", "forbidden")  # same uid
    assert alice_outside.ask(protocol.Report(job_id=in_a.job_id, samples=32)) == ("error", "forbidden")
    assert in_a.ask(protocol.End(job_id=in_b.job_id, exit_code=0)) == ("error", "forbidden")
    assert in_b.ask(protocol.End(job_id=in_a.job_id, exit_code=0)) == ("error", "forbidden")
    assert in_a.ask(protocol.SetPolicy(policy="static")) == ("error", "forbidden")
    assert alice_outside.ask(protocol.SetPolicy(policy="even")) == ("error", "forbidden")
    assert in_a.ask(protocol.SetWorkers(job_id=in_b.job_id, num_workers=2)) == ("error", "forbidden")

    def measured() -> NodeSnapshot | None:  # status shows each control step's measurement
        status = controller.status()
        return status if any(j.samples_total for j in status.jobs) else None

    status = wait_until(measured, 10, "the next control step to measure A's report")
    assert status.policy == "even"
    samples = {j.job_id: j.samples_total for j in status.jobs}
    assert samples == {in_a.job_id: 32, in_b.job_id: 0, also_alice.job_id: 0}  # only A's own report counted
    assert status.errors_total.get("forbidden") == 8  # each refusal above, counted
    assert {j.job_id: j.workers_pinned for j in status.jobs} == dict.fromkeys(owners)  # the refused pin changed nothing

    # A uid may pin its own jobs' workers (from any of its processes), root anyone's.
    assert alice_outside.ask(protocol.SetWorkers(job_id=in_a.job_id, num_workers=2)) == ("ok", None)
    assert _reply(controller, protocol.SetWorkers(job_id=in_b.job_id, num_workers=3)) == ("ok", None)
    wait_until(lambda: {j.job_id: j.workers_pinned for j in controller.status().jobs} == {
        in_a.job_id: 2, in_b.job_id: 3, also_alice.job_id: None}, 10, "the next control step to show both pins")

    # A uid may end its own jobs (from any of its processes), root may end anyone's.
    assert alice_outside.ask(protocol.End(job_id=also_alice.job_id, exit_code=0)) == ("ok", None)
    assert _reply(controller, protocol.End(job_id=in_b.job_id, exit_code=0)) == ("ok", None)


def test_job_ids_that_look_like_paths_name_no_job(controller: ControllerProcess) -> None:
    group = Path("/sys/fs/cgroup/cpu") / controller.group
    before = sorted(p.name for p in group.iterdir()) if group.exists() else []
    for job_id in ("", ".", "..", "/", "../..", f"../{controller.group}", "cgroup.procs", "j\u2028"):
        assert _reply(controller, protocol.Report(job_id=job_id)) == ("error", "unknown_job"), job_id
        assert _reply(controller, protocol.End(job_id=job_id)) == ("error", "unknown_job"), job_id
    assert (sorted(p.name for p in group.iterdir()) if group.exists() else []) == before


def test_a_controller_refuses_a_socket_path_where_something_listens_and_touches_nothing(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    path, group = tmp_path / "listening.sock", f"adloader-test-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:  # a listener that is not a controller
        listener.bind(str(path))
        listener.listen()
        before = path.lstat()
        result = subprocess.run(
            [sys.executable, "-m", "adloader", "controller", "--socket", str(path), "--state-dir",
             str(tmp_path / "state"), "--cgroup-group", group, "--policy", "even", "--cpus", "0"],
            capture_output=True, text=True, timeout=60, cwd=REPO, env=base_environment(),
        )
        assert result.returncode == 1 and "another controller is already listening" in result.stderr, result.stderr
        assert path.lstat().st_ino == before.st_ino
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # the other listener still owns its socket
    assert not (Path("/sys/fs/cgroup/cpu") / group).exists() and not (tmp_path / "state").exists()


def test_only_a_socket_nobody_listens_on_is_cleared_from_the_socket_path(tmp_path: Path) -> None:
    """prepare_socket_path (what the controller does first) on every kind of thing at the path."""
    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound_only:
        listener.bind(str(live))
        listener.listen()
        bound_only.bind(str(tmp_path / "stale.sock"))  # bound by a live process, never listening
        (tmp_path / "file.sock").write_text("keep me\n")
        (tmp_path / "dir.sock").mkdir()
        (tmp_path / "link-live.sock").symlink_to(live)
        (tmp_path / "link-stale.sock").symlink_to(tmp_path / "stale.sock")
        for name in ("live.sock", "file.sock", "dir.sock", "link-live.sock", "link-stale.sock"):
            before = (tmp_path / name).lstat()
            with pytest.raises(SocketInUse):
                prepare_socket_path(tmp_path / name)
            after = (tmp_path / name).lstat()
            assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), name
        prepare_socket_path(tmp_path / "stale.sock")
        assert not (tmp_path / "stale.sock").exists()
    assert (tmp_path / "file.sock").read_text() == "keep me\n"


def test_the_socket_is_0666_in_a_0755_directory_whatever_the_umask(
    controller: ControllerProcess, users: tuple[pwd.struct_passwd, pwd.struct_passwd], agents: Callable[..., Agent],
) -> None:
    controller.kill()
    controller.socket = controller.socket.parent / "made-by-the-controller" / "adloader.sock"
    previous = os.umask(0o077)  # inherited by the controller: the modes must not depend on it
    try:
        controller.start()
    finally:
        os.umask(previous)
    socket_stat, directory_stat = controller.socket.lstat(), controller.socket.parent.lstat()
    assert stat.S_ISSOCK(socket_stat.st_mode) and stat.S_IMODE(socket_stat.st_mode) == 0o666
    assert stat.S_ISDIR(directory_stat.st_mode) and stat.S_IMODE(directory_stat.st_mode) == 0o755
    assert (socket_stat.st_uid, directory_stat.st_uid) == (0, 0)
    outsider = agents(users[0])  # any local user may connect and read the node's status
    assert outsider.ask(protocol.StatusRequest()) == ("status_reply", None)
