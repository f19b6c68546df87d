"""The ``adloader`` dispatcher: arguments reach the subcommand verbatim, help stays light, and a
usage error is one plain line that says what is wrong and what to do."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from adloader.cli import SUBCOMMANDS, split_command
from adloader.cpuspec import format_cpus, online_cpus
from bench.controller_process import REPO, base_environment


@pytest.mark.parametrize(
    "argv, head, rest",
    [
        (["run", "--", "torchrun", "--nproc-per-node", "2", "t.py"], ["run"], ["--", "torchrun", "--nproc-per-node", "2", "t.py"]),
        (["--log-level", "DEBUG", "controller", "--period", "1"], ["--log-level", "DEBUG", "controller"], ["--period", "1"]),
        (["--log-level=WARNING", "status", "--json"], ["--log-level=WARNING", "status"], ["--json"]),
        (["--version"], ["--version"], []),
    ],
)
def test_split_command_keeps_the_commands_arguments_verbatim(argv: list[str], head: list[str], rest: list[str]) -> None:
    assert split_command(argv) == (head, rest)


def test_top_level_help_lists_every_command_without_importing_torch_or_the_controller() -> None:
    code = (
        "import sys, runpy\n"
        "sys.argv = ['adloader', '--help']\n"
        "try:\n    runpy.run_module('adloader', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'controller', 'scipy', 'sklearn') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in SUBCOMMANDS:
        assert name in out
    assert "HEAVY []" in out


def test_version_prints_the_package_version() -> None:
    import adloader

    out = subprocess.run([sys.executable, "-m", "adloader", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"adloader {adloader.__version__}"


def _adloader(*args: str, **environ: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adloader", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=base_environment(**environ))


def _one_plain_line(proc: subprocess.CompletedProcess, command: str) -> str:
    """The only line of stderr, checked to be plain: the command's name first, no timestamp, no level."""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"{command}: "), line
    assert not re.search(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d|ERROR|Traceback", line), line
    return line


def test_unknown_command_is_one_line_naming_the_choices() -> None:
    proc = _adloader("frobnicate")
    assert proc.returncode == 2
    line = _one_plain_line(proc, "adloader")
    assert "invalid choice: 'frobnicate'" in line and "controller" in line and "'adloader --help'" in line


@pytest.mark.parametrize(
    "args, command, advice",
    [
        (["run"], "adloader run", "put the training command after --"),
        (["run", "--"], "adloader run", "put the training command after --"),
        (["run", "--gpus", "-1", "--", "true"], "adloader run", "'adloader run --help'"),
        (["controller", "--backend", "nonsense"], "adloader controller", "choose from 'auto', 'cgroup-v1'"),
        (["controller", "--cpus", "0,9999"], "adloader controller", "online CPUs are "),
        (["controller", "--cpus", "x"], "adloader controller", "not a CPU id or a range like '2-5'"),
        (["controller", "--without", "fast_mode"], "adloader controller", "--without takes a comma-separated list of"),
        (["bench", "--without", "fast_mode"], "adloader bench", "--without takes a comma-separated list of"),
        (["bench", "--mix", "nonexistent.json"], "adloader bench", str(REPO / "bench" / "mixes")),
        (["bench", "--mix", "/etc/passwd"], "adloader bench", str(REPO / "bench" / "mixes")),
        (["bench", "--cpus", "9999"], "adloader bench", "online CPUs are "),
        (["demo", "--mix", "/etc/passwd"], "adloader demo", str(REPO / "bench" / "mixes")),
        (["status", "--socket", "/nonexistent/adloader.sock"], "adloader status", "start one (sudo systemctl start"),
        (["model"], "adloader model", "'adloader model --help'"),
    ],
)
def test_a_usage_error_is_one_plain_line_saying_what_to_do(args: list[str], command: str, advice: str) -> None:
    proc = _adloader(*args)
    assert proc.returncode == 2, proc.stderr
    assert advice in _one_plain_line(proc, command)


def test_an_offline_cpu_is_answered_with_this_nodes_online_cpus() -> None:
    online = format_cpus(online_cpus())
    line = _one_plain_line(_adloader("controller", "--cpus", "9998-9999"), "adloader controller")
    assert line == (f"adloader controller: --cpus 9998-9999 names CPUs that are not online (9998-9999): this node's "
                    f"online CPUs are {online}; give a list of those, e.g. --cpus {online}")


def test_a_terminal_commands_warning_is_a_plain_line_and_the_daemon_keeps_timestamps(tmp_path: Path) -> None:
    run = _adloader("run", "--", sys.executable, "-c", "pass", ADLOADER_SOCKET=str(tmp_path / "none.sock"))
    assert run.returncode == 0
    assert _one_plain_line(run, "adloader run").startswith("adloader run: warning: no controller at ")
    code = ("import logging, sys; from adloader.cli import configure_logging; "
            "configure_logging('controller', 'INFO'); logging.getLogger('controller.loop').warning('slow')")
    daemon = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING controller.loop: slow\n", daemon.stderr)


def test_output_cut_short_by_a_closed_pipe_ends_quietly() -> None:
    """``adloader doctor | head -1``: the reader closes the pipe early; the command ends without a traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "adloader", "doctor"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=base_environment())
    proc.stdout.readline()
    proc.stdout.close()  # before the rest is written
    _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr.decode() and "BrokenPipeError" not in stderr.decode(), stderr.decode()
