"""The ``adloader`` dispatcher: arguments reach the subcommand verbatim, help stays light."""
from __future__ import annotations

import subprocess
import sys

import pytest

from adloader.cli import SUBCOMMANDS, split_command


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


def test_unknown_command_is_an_argparse_error_naming_the_choices() -> None:
    proc = subprocess.run([sys.executable, "-m", "adloader", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr and "controller" in proc.stderr
