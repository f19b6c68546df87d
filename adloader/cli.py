"""The ``adloader`` command: a thin dispatcher that imports each subcommand lazily.

Each subcommand lives in its own module exposing ``configure(parser)`` (adds its
arguments) and ``main(args) -> int``. Only the chosen module is imported, so
``adloader --help`` imports neither torch nor the controller.

Usage errors are reported here, in one place, as one plain line: argparse's own
(a bad option value) and any :class:`AdloaderError` a subcommand's ``main`` raises
(a bad CPU list, an unreadable mix). The line names the command, says what is wrong
and what to do, and carries no timestamp or module name.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from typing import NoReturn, Sequence

from adloader import __version__
from adloader.errors import AdloaderError

# name -> (module, one-line help). Order is the order shown in --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "controller": ("controller.cli", "run the node daemon in the foreground"),
    "run": ("launcher.cli", "run a training command as a managed job: adloader run -- torchrun ..."),
    "status": ("adloader.status", "show the node's jobs and what each was given"),
    "workers": ("adloader.workers_command", "pin a job's DataLoader workers, or 'auto': adloader workers JOB N|auto"),
    "demo": ("bench.demo", "short GPU-emulated run of the shipped job mix: adaptive vs even"),
    "bench": ("bench.node", "GPU-emulated node benchmark comparing the policies on a job mix"),
    "model": ("throughput_model.cli", "profile, fit, evaluate and query the throughput model"),
    "doctor": ("controller.doctor_cli", "check whether this node is ready for the controller, and what to fix"),
}

DAEMONS = frozenset({"controller"})
"""Commands whose log is read later (journald, a file): each line keeps its time, level and module.
The others talk to the person at the terminal: their lines start with the command's name."""

EXIT_USAGE = 2


class CommandLineParser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is one line: what is wrong, and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


class TerminalFormatter(logging.Formatter):
    """``adloader run: warning: no controller ...``: the command's name, the level when it is a
    warning or worse, the message. Tracebacks are kept (they are for bugs, not usage errors)."""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        text = f"{self.prog}: {level}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(command: str, level: str) -> None:
    """A daemon, and any command at DEBUG, logs with timestamps and module names; a terminal command
    logs plain lines that start with its name."""
    handler = logging.StreamHandler(sys.stderr)
    if command in DAEMONS or level == "DEBUG":
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(TerminalFormatter(f"adloader {command}"))
    logging.basicConfig(level=getattr(logging, level), handlers=[handler])


def _top_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
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
    """Parse the command line, configure logging once, and run the chosen subcommand.
    An AdloaderError out of the subcommand is a usage error: one line, exit status 2."""
    head, rest = split_command(sys.argv[1:] if argv is None else argv)
    top = _top_parser().parse_args(head)
    configure_logging(top.command, top.log_level)
    prog = f"adloader {top.command}"
    module_name, help_ = SUBCOMMANDS[top.command]
    module = importlib.import_module(module_name)
    sub = CommandLineParser(prog=prog, description=help_)
    module.configure(sub)
    args = sub.parse_args(rest)
    try:
        code = int(module.main(args) or 0)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then the BrokenPipeError below
        return code
    except AdloaderError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `adloader status | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 128 + signal.SIGPIPE
