"""``adloader run [OPTIONS] -- COMMAND...``: run a training command as a managed job."""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from adloader import paths
from adloader.errors import AdloaderError


class LaunchError(AdloaderError):
    """The command line of ``adloader run`` is unusable; the message says how to fix it."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("adloader run [--name NAME] [--gpus N] [--num-workers N] [--samples N] [--model-features FILE] "
                    "[--socket PATH] [--no-substitute] -- COMMAND...")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "controller socket: --socket PATH, else $ADLOADER_SOCKET, else the first that answers of\n"
        f"  {paths.SYSTEM_SOCKET} (the node's system controller) and, for users other than root,\n"
        "  $XDG_RUNTIME_DIR/adloader/adloader.sock (or /tmp/adloader-<uid>/adloader.sock: a controller of your own).\n"
        "With none answering, the command runs unmanaged after one warning line."
    )
    parser.add_argument("--name", default=None,
                        help="job name shown by `adloader status` (default: the training script's file name)")
    parser.add_argument("--gpus", type=_count, default=None, metavar="N",
                        help="GPUs the job uses on this node (default: the entries of CUDA_VISIBLE_DEVICES; "
                        "when it is unset, the node's NVIDIA GPUs, none on a CPU-only node)")
    parser.add_argument("--num-workers", type=_count, default=None, metavar="N",
                        help="DataLoader workers per rank the job would use unmanaged")
    parser.add_argument("--samples", type=_count, default=None, metavar="N",
                        help="samples the job will process in all, if known (lets --policy jct finish short jobs first)")
    parser.add_argument("--model-features", type=Path, default=None, metavar="FILE",
                        help="JSON object of model features (from `adloader model`) for the throughput prediction")
    parser.add_argument("--socket", type=Path, default=None, metavar="PATH",
                        help="the controller's socket (default: $ADLOADER_SOCKET, else the search order below)")
    parser.add_argument("--no-substitute", dest="substitute", action="store_false",
                        help="leave the job's DataLoaders torch's (by default every torch DataLoader the job's "
                        "processes build is adloader's, resized by the controller, with no code change)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")


def main(args: argparse.Namespace) -> int:
    from launcher.run import JobRequest, default_name, gpus_from_environment, run_job

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise LaunchError("no command given: put the training command after --, "
                          "e.g. adloader run -- torchrun --nproc-per-node 2 train.py")
    request = JobRequest(
        command=tuple(command),
        name=args.name or default_name(command),
        gpus=args.gpus if args.gpus is not None else gpus_from_environment(os.environ),
        num_workers=args.num_workers,
        features=load_features(args.model_features) if args.model_features else None,
        samples=args.samples,
        substitute=args.substitute,
    )
    return run_job(request, [args.socket] if args.socket else paths.client_socket_paths())


def load_features(path: Path) -> dict[str, float]:
    """A JSON object of finite numbers, as Register.features carries it."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise LaunchError(f"cannot read --model-features {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise LaunchError(f"--model-features {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in data.items()
    ):
        raise LaunchError(f"--model-features {path} must be a JSON object of names to finite numbers")
    return {k: float(v) for k, v in data.items()}


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value
