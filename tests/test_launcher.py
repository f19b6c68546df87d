"""``adloader run``: exit codes and signals pass through, the no-controller path is one warning
line, a terminal's Ctrl-C reaches the command once, and the pure helpers."""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Callable

import pytest

from bench.controller_process import (
    REPO,
    ControllerProcess,
    JobProcess,
    base_environment,
    default_signal_dispositions,
    wait_until,
)
from launcher.cli import load_features
from launcher.run import default_name, exit_code_of, gpus_from_environment

READY_THEN_SLEEP = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(60)
"""

COUNT_SIGINTS = """
import pathlib, signal, sys, time
received = []
signal.signal(signal.SIGINT, lambda *_: received.append(1))
pathlib.Path(sys.argv[1]).write_text("ready")
while not received:
    time.sleep(0.01)
time.sleep(1.0)                  # time for a second, forwarded copy to arrive
pathlib.Path(sys.argv[2]).write_text(str(len(received)))
"""

TERM_HANDLER = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(sys.argv[2]).write_text("got SIGTERM"), sys.exit(0)))
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(60)
"""


def _python(code: str, *args: object) -> tuple[str, ...]:
    return (sys.executable, "-c", code, *map(str, args))


def test_a_managed_jobs_exit_code_passes_through(controller: ControllerProcess) -> None:
    job = controller.run(*_python("import sys; sys.exit(3)"), name="three")
    assert job.wait() == 3, job.output()
    assert "ended with exit code 3" in wait_until(lambda: "ended with exit code" in controller.log()
                                                  and controller.log(), 5, "the End message")


def test_without_a_controller_one_warning_line_and_the_command_runs_unmanaged(
    start_job: Callable[..., JobProcess],
) -> None:
    job = start_job(*_python("import os, sys; print(os.environ.get('ADLOADER_JOB_ID')); sys.exit(3)"),
                    name="alone")
    assert job.wait() == 3
    stdout, stderr = job.output()
    assert stdout == "None\n"
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("adloader run: warning: no controller") and "unmanaged" in lines[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_sent_to_the_launcher_reaches_the_command_and_its_death_is_the_exit_code(
    start_job: Callable[..., JobProcess], tmp_path: Path, signum: int,
) -> None:
    ready = tmp_path / "ready"
    job = start_job(*_python(READY_THEN_SLEEP, ready), name="sleeper")
    wait_until(ready.exists, 20, "the command to start")
    job.signal(signum)
    assert job.wait(20) == 128 + signum


def test_a_signal_the_launcher_inherited_ignored_stays_ignored_by_the_command(tmp_path: Path) -> None:
    """``nohup adloader run -- CMD``: the command ignores SIGHUP as the launcher's parent asked,
    so a forwarded SIGHUP leaves it running (a test run under nohup once saw this as a launcher
    that "did not exit": the test's commands inherited the ignored SIGHUP, see
    bench.controller_process.default_signal_dispositions)."""
    ready = tmp_path / "ready"

    def nohup() -> None:
        default_signal_dispositions()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    stderr = (tmp_path / "launcher.err").open("w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "adloader", "--log-level", "DEBUG", "run", "--name", "nohup", "--",
         *_python(READY_THEN_SLEEP, ready)],
        stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO, env=base_environment(ADLOADER_SOCKET=str(tmp_path / "no.sock")),
        start_new_session=True, preexec_fn=nohup,
    )
    try:
        wait_until(ready.exists, 20, "the command to start")
        launcher.send_signal(signal.SIGHUP)
        wait_until(lambda: "forwarding SIGHUP" in (tmp_path / "launcher.err").read_text(), 20, "the forwarded SIGHUP")
        launcher.send_signal(signal.SIGTERM)  # forwarded after SIGHUP: 129 if SIGHUP had ended the command
        assert launcher.wait(20) == 128 + signal.SIGTERM
    finally:
        stderr.close()
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def test_a_command_that_handles_sigterm_decides_the_exit_code(
    start_job: Callable[..., JobProcess], tmp_path: Path,
) -> None:
    ready, note = tmp_path / "ready", tmp_path / "note"
    job = start_job(*_python(TERM_HANDLER, ready, note), name="graceful")
    wait_until(ready.exists, 20, "the command to start")
    job.signal(signal.SIGTERM)
    assert job.wait(20) == 0
    assert note.read_text() == "got SIGTERM"


def test_ctrl_c_on_a_terminal_reaches_the_command_once(tmp_path: Path) -> None:
    """The terminal sends SIGINT to the whole foreground process group, the command included;
    the launcher must not forward a second copy."""
    ready, count = tmp_path / "ready", tmp_path / "count"
    master, slave = os.openpty()
    environ = base_environment(ADLOADER_SOCKET=str(tmp_path / "none.sock"))

    def take_terminal() -> None:  # runs in the child after setsid: make the pty its controlling terminal
        default_signal_dispositions()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    launcher = subprocess.Popen(
        [sys.executable, "-m", "adloader", "run", "--name", "ctrl-c", "--", *_python(COUNT_SIGINTS, ready, count)],
        stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=environ, start_new_session=True,
        preexec_fn=take_terminal,
    )
    os.close(slave)
    try:
        wait_until(ready.exists, 20, "the command to start")
        os.write(master, b"\x03")  # Ctrl-C, as typed
        assert launcher.wait(20) == 0
        assert count.read_text() == "1"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        os.close(master)


def test_a_missing_command_exits_127(start_job: Callable[..., JobProcess]) -> None:
    job = start_job("/nonexistent/train", name="missing")
    assert job.wait() == 127
    assert "command not found: /nonexistent/train" in job.output()[1]


def test_no_command_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, "-m", "adloader", "run", "--name", "x"], capture_output=True,
                            text=True, cwd=REPO, env=base_environment(), timeout=30)
    assert result.returncode == 2 and "no command given" in result.stderr


@pytest.mark.parametrize(
    "value, gpus", [(None, 2), ("", 0), ("0", 1), ("0,1,3", 3), ("GPU-1f2e,GPU-77aa", 2), ("0,-1,2", 1), ("-1", 0)]
)
def test_gpus_default_to_the_devices_cuda_would_see(value: str | None, gpus: int, tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):  # two GPUs and the driver's control devices
        (tmp_path / name).touch()
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert gpus_from_environment(environ, dev=tmp_path) == gpus


def test_a_job_on_a_node_without_gpus_has_none_unless_it_says_so(tmp_path: Path) -> None:
    assert gpus_from_environment({}, dev=tmp_path) == 0


def test_the_default_name_is_the_training_scripts_file_name() -> None:
    assert default_name(["torchrun", "--nproc-per-node", "2", "/src/train_resnet.py", "--lr", "0.1"]) == "train_resnet.py"
    assert default_name(["/usr/bin/my-trainer", "--config", "a.yaml"]) == "my-trainer"


def test_wait_statuses_become_shell_exit_codes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.1)
    child.send_signal(signal.SIGKILL)
    _, status = os.waitpid(child.pid, 0)
    assert exit_code_of(status) == 137
    child.returncode = 137  # reaped above; keep Popen from waiting again
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
    _, status = os.waitpid(done.pid, 0)
    done.returncode = 5
    assert exit_code_of(status) == 5


def test_the_exit_code_passes_even_when_the_launcher_inherits_sigchld_ignored(tmp_path: Path) -> None:
    def ignore_sigchld() -> None:  # survives exec, as it would from a careless parent
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    result = subprocess.run(
        [sys.executable, "-m", "adloader", "run", "--", *_python("import sys; sys.exit(3)")],
        cwd=REPO, env=base_environment(ADLOADER_SOCKET=str(tmp_path / "none.sock")), capture_output=True,
        timeout=30, preexec_fn=ignore_sigchld,
    )
    assert result.returncode == 3, result.stderr


def test_model_features_must_be_a_json_object_of_numbers(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"flops": 4.1e9, "batch_size": 64}')
    bad.write_text('{"flops": "many"}')
    assert load_features(good) == {"flops": 4.1e9, "batch_size": 64.0}
    result = subprocess.run([sys.executable, "-m", "adloader", "run", "--model-features", str(bad), "--", "true"],
                            capture_output=True, text=True, cwd=REPO, env=base_environment(), timeout=30)
    assert result.returncode == 2 and "must be a JSON object of names to finite numbers" in result.stderr


def test_a_signal_during_registration_ends_the_launch_without_starting_the_command(
    start_job: Callable[..., JobProcess], tmp_path: Path,
) -> None:
    """The job's owner may signal it as soon as it is registered, before the command exists:
    the launcher must neither die by the signal's default action nor start the command."""
    started = tmp_path / "started"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "slow.sock"))
    listener.listen(1)
    listener.settimeout(30)
    job = start_job(*_python("import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('x')", started),
                    name="early", socket=tmp_path / "slow.sock")
    connection, _ = listener.accept()
    with connection, listener:
        connection.settimeout(30)
        assert b"register" in connection.recv(65536).lower()  # the launcher now waits for the reply
        job.signal(signal.SIGTERM)
        time.sleep(0.5)
    assert job.wait(20) == 128 + signal.SIGTERM
    assert not started.exists()
    assert "SIGTERM arrived before the command started" in job.output()[1]
