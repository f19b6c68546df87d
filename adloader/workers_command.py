"""``adloader workers JOB N|auto``: pin a job's DataLoader workers, or give them back to its policy.

An operator's override of one lever: the job's loaders run ``N`` workers in all (split evenly
over its ranks), still within what its memory holds; its cores and bandwidth stay the policy's.
The controller lets the job's owner or root do it (a :class:`~adloader.protocol.SetWorkers`
request, checked against the peer's kernel credentials). ``auto`` lets the policy decide again.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from adloader import paths, protocol
from adloader.client import connect_first
from adloader.errors import AdloaderError, ControllerRefused, ControllerUnavailable
from adloader.status import EXIT_NO_CONTROLLER, EXIT_REFUSED, NO_CONTROLLER_ADVICE

AUTO = "auto"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="the job's id, as 'adloader status' lists it")
    parser.add_argument("workers", metavar="N|auto",
                        help="DataLoader workers for the whole job, split evenly over its ranks; "
                        "'auto' gives them back to the policy")
    parser.add_argument("--socket", type=Path, default=None,
                        help="controller socket (default: $ADLOADER_SOCKET, else the first that answers)")


def parse_workers(text: str) -> int | None:
    """``N`` (a whole number >= 1) or ``auto`` (None). Raises AdloaderError, one line, otherwise."""
    if text == AUTO:
        return None
    try:
        workers = int(text)
    except ValueError:
        workers = 0
    if workers < 1:
        raise AdloaderError(f"{text!r} is not a number of workers: give a whole number from 1, or 'auto'")
    return workers


def main(args: argparse.Namespace) -> int:
    workers = parse_workers(args.workers)
    try:
        with connect_first([args.socket] if args.socket else paths.client_socket_paths()) as client:
            client.request(protocol.SetWorkers(job_id=args.job, num_workers=workers))
    except ControllerUnavailable as exc:
        print(f"adloader workers: {exc}; {NO_CONTROLLER_ADVICE}", file=sys.stderr)
        return EXIT_NO_CONTROLLER
    except ControllerRefused as exc:
        print(f"adloader workers: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"job {args.job}: " + ("workers given back to the policy" if workers is None else
                                 f"workers pinned to {workers} in all, split over its ranks"))
    return 0
