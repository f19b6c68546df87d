"""The ``adloader`` command: a thin dispatcher that imports each subcommand lazily.

Each subcommand lives in its own module exposing ``configure(parser)`` (adds its
arguments) and ``main(args) -> int``. Only the chosen module is imported, so
``adloader --help`` imports neither torch nor the controller.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from adloader import __version__

# name -> (module, one-line help). Order is the order shown in --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "controller": ("controller.cli", "run the node daemon in the foreground"),
    "run": ("launcher.cli", "run a training command as a managed job: adloader run -- torchrun ..."),
    "status": ("adloader.status", "show the node's jobs and what each was given"),
    "demo": ("bench.demo", "short GPU-emulated run of the shipped job mix: adaptive vs even"),
    "bench": ("bench.node", "GPU-emulated node benchmark comparing the policies on a job mix"),
    "model": ("throughput_model.cli", "profile, fit, evaluate and query the throughput model"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adloader",
        usage="adloader [--version] [--log-level LEVEL] COMMAND [ARGS...]",
        description="Keeps a shared GPU node's GPUs busy: moves CPU cores, read bandwidth and "
        "DataLoader workers between training jobs while they run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {name:<11} {help_}" for name, (_, help_) in SUBCOMMANDS.items())
        + "\n\nRun 'adloader COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"adloader {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default INFO)",
    )
    parser.add_argument("command", choices=list(SUBCOMMANDS), metavar="COMMAND", help=argparse.SUPPRESS)
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split argv at the subcommand name: (top-level options + command, the command's own args).

    Done by hand so the command's arguments, ``--`` included, reach it verbatim
    (``adloader run -- torchrun --nproc-per-node 2 train.py``)."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--log-level":
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return argv[: i + 1], argv[i + 1 :]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, configure logging once, and run the chosen subcommand."""
    head, rest = split_command(sys.argv[1:] if argv is None else argv)
    top = _top_parser().parse_args(head)
    logging.basicConfig(
        level=getattr(logging, top.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    module_name, help_ = SUBCOMMANDS[top.command]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"adloader {top.command}", description=help_)
    module.configure(sub)
    args = sub.parse_args(rest)
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        return 130
