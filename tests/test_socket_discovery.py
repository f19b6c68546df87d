"""One node, one socket: a real unprivileged user's plain ``adloader run`` and ``adloader status``
find the root controller at /run/adloader/adloader.sock; the search order; what the
unmanaged warning names.

The end-to-end test needs the real system socket path, so it holds a lock file for its
run (two test sessions on one machine take turns) and skips if a real system controller
already answers there.
"""
from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from adloader import paths
from adloader.client import connect_first
from adloader.errors import ControllerUnavailable
from bench.controller_process import REPO, ControllerProcess, base_environment, cgroup_of, wait_until

SYSTEM_SOCKET_TURN = Path("/tmp/adloader-test-system-socket.lock")

USER_JOB = """
echo "socket=$ADLOADER_SOCKET job=$ADLOADER_JOB_ID"
while [ ! -e "$1" ]; do sleep 0.05; done
"""


def test_clients_look_at_the_system_socket_first_then_their_own() -> None:
    system = Path("/run/adloader/adloader.sock")
    assert paths.client_socket_paths({"XDG_RUNTIME_DIR": "/run/user/1000"}, uid=1000) == (
        system, Path("/run/user/1000/adloader/adloader.sock"))
    assert paths.client_socket_paths({}, uid=1000) == (system, Path("/tmp/adloader-1000/adloader.sock"))
    assert paths.client_socket_paths({}, uid=0) == (system,)
    assert paths.client_socket_paths({"ADLOADER_SOCKET": "/x.sock"}, uid=1000) == (Path("/x.sock"),)
    # A controller serves the system socket as root and the per-user one otherwise.
    assert paths.default_socket_path({}, uid=0) == system
    assert paths.default_socket_path({}, uid=1000) == Path("/tmp/adloader-1000/adloader.sock")


def test_no_controller_anywhere_names_every_path_tried(tmp_path: Path) -> None:
    missing, stale = tmp_path / "missing.sock", tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(stale))  # a socket file nobody listens on
        with pytest.raises(ControllerUnavailable) as raised:
            connect_first([missing, stale])
    assert str(raised.value) == (f"no controller at {missing}: No such file or directory, "
                                 f"nor at {stale}: Connection refused")


def test_the_launcher_warning_names_the_system_socket_it_tried() -> None:
    if os.geteuid() != 0:
        pytest.skip("as root the launcher's only default is the system socket")
    with _system_socket_turn():
        result = subprocess.run([sys.executable, "-m", "adloader", "run", "--", "true"], capture_output=True,
                                text=True, cwd=REPO, env=base_environment(), timeout=60)
    assert result.returncode == 0
    (line,) = result.stderr.splitlines()
    assert f"no controller at {paths.SYSTEM_SOCKET}: " in line and "running true unmanaged" in line


def test_run_help_names_the_socket_option_and_the_variable() -> None:
    result = subprocess.run([sys.executable, "-m", "adloader", "run", "--help"], capture_output=True, text=True,
                            cwd=REPO, env=base_environment(), timeout=60)
    assert "--socket PATH" in result.stdout and "ADLOADER_SOCKET" in result.stdout
    assert str(paths.SYSTEM_SOCKET) in result.stdout


def test_run_socket_option_reaches_a_controller_on_another_path(
    controller: ControllerProcess, tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "adloader", "run", "--socket", str(controller.socket), "--name", "by-option", "--",
         "/bin/sh", "-c", 'echo "$ADLOADER_SOCKET $ADLOADER_JOB_ID"'],
        capture_output=True, text=True, cwd=REPO, env=base_environment(), timeout=60,
    )
    assert result.returncode == 0, result.stderr
    socket_path, job_id = result.stdout.split()
    assert socket_path == str(controller.socket) and job_id.startswith("j")
    assert "warning:" not in result.stderr


def test_an_unprivileged_users_plain_adloader_run_is_managed_by_the_root_controller(
    start_controller: Callable[..., ControllerProcess], users: tuple[pwd.struct_passwd, pwd.struct_passwd],
    tmp_path: Path,
) -> None:
    alice, _ = users
    shared = Path(tempfile.mkdtemp(prefix="adl-discovery-", dir="/tmp"))  # pytest's tmp_path is root's alone
    os.chmod(shared, 0o755)
    done = shared / "done"
    with _system_socket_turn():
        controller = start_controller("--policy", "even", "--cpus", "0", socket=paths.SYSTEM_SOCKET)
        launcher = _as_user(alice, ["run", "--name", "alice-job", "--", "/bin/sh", "-c", USER_JOB, "sh", str(done)],
                            tmp_path / "run")
        try:
            job = wait_until(lambda: next((j for j in controller.status().jobs if j.launcher_pid == launcher), None),
                             30, "alice's job to register")
            assert job.name == "alice-job" and job.uid == alice.pw_uid
            assert cgroup_of(launcher, "cpu") == f"/{controller.group}/{job.job_id}"
            status = _as_user(alice, ["status", "--json"], tmp_path / "status")
            assert _exit_code(status) == 0
            assert job.job_id in (tmp_path / "status.out").read_text()
        finally:
            done.touch()
            code = _exit_code(launcher)
    assert code == 0, (tmp_path / "run.err").read_text()
    assert (tmp_path / "run.out").read_text() == f"socket={paths.SYSTEM_SOCKET} job={job.job_id}\n"
    assert "warning:" not in (tmp_path / "run.err").read_text()
    shutil.rmtree(shared)


def _as_user(user: pwd.struct_passwd, argv: list[str], output: Path) -> int:
    """Fork, become ``user`` with a clean login-like environment (no ADLOADER_SOCKET), and run
    ``adloader ARGV`` in the child; its output goes to OUTPUT.out/.err. The child's pid.
    (In-process: the interpreter lives under /root, which the user cannot exec.)"""
    out = os.open(f"{output}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(f"{output}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.environ.clear()
            os.environ.update(PATH="/usr/bin:/bin", HOME="/", USER=user.pw_name, LANG="C.UTF-8",
                              PYTHONPATH=str(REPO))
            from adloader.cli import main

            code = main(argv)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(out)
    os.close(err)
    return pid


def _exit_code(pid: int, timeout: float = 60.0) -> int:
    """Reap the forked child ``pid``; its exit code."""
    def reaped() -> tuple[int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return (os.waitstatus_to_exitcode(status),) if done == pid else None

    return wait_until(reaped, timeout, f"pid {pid} to exit")[0]


class _system_socket_turn:
    """Hold the machine-wide turn on the system socket path; skip if a real controller is there."""

    def __enter__(self) -> "_system_socket_turn":
        self._fd = os.open(SYSTEM_SOCKET_TURN, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            connect_first([paths.SYSTEM_SOCKET], timeout=2.0).close()
        except ControllerUnavailable:
            return self
        self.__exit__()
        pytest.skip(f"a controller already serves {paths.SYSTEM_SOCKET} on this machine; the test needs that path")

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)
