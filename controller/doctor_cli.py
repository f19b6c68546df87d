"""``adloader doctor``: whether this node is ready for the controller, and what to fix.

The checks are in controller/doctor.py; this module parses the options and words the
findings (pure: :func:`render` takes findings and returns text). Exit status 0 when
every check is ok, 1 on warnings, 2 on failures, so a provisioning script can gate on it.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from adloader import paths
from controller.cli import parse_size

LEGEND = "ok: ready; warn: works, with less (the fix says how to get it); fail: the controller cannot work as is"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = f"Exit status: 0 all ok, 1 warnings, 2 failures. {LEGEND}."
    parser.add_argument("--socket", type=Path, default=None, metavar="PATH",
                        help="controller socket to try (default: $ADLOADER_SOCKET, else the search of adloader run)")
    parser.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                        help="the controller's state directory (default /var/lib/adloader as root)")
    parser.add_argument("--cgroup-group", default="adloader", metavar="NAME",
                        help="the cgroup job groups go under (the controller's --cgroup-group; default adloader)")
    parser.add_argument("--data", type=Path, default=None, metavar="DIR",
                        help="where the datasets are read from, to find the read device (default: here)")
    parser.add_argument("--memory-reserve", type=parse_size, default=None, metavar="BYTES",
                        help="the reserve the controller will keep, e.g. 4G (default: its default, 5%% of memory, "
                        "at least 1G)")
    parser.add_argument("--python", default=sys.executable, metavar="PATH",
                        help="the Python whose torch to check (default: this one)")
    parser.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"), help=argparse.SUPPRESS)
    parser.add_argument("--proc", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    parser.add_argument("--sys", type=Path, default=Path("/sys"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def main(args: argparse.Namespace) -> int:
    from controller.doctor import NodeRoots, exit_status, run_checks

    roots = NodeRoots(cgroup=args.cgroup_root, proc=args.proc, sys=args.sys)
    findings = run_checks(roots, args.cgroup_group, args.state_dir or paths.default_state_dir(),
                          [args.socket] if args.socket else paths.client_socket_paths(), args.data,
                          args.memory_reserve, args.python)
    if args.json:
        print(json.dumps({"status": exit_status(findings), "findings": [asdict(f) for f in findings]}, indent=1))
    else:
        print(render(findings))
    return exit_status(findings)


def render(findings: Sequence) -> str:
    """One line per check (level, name, what was found), its fix under it, then a one-line verdict."""
    width = max(len(f.check) for f in findings)
    lines = []
    for finding in findings:
        lines.append(f"{finding.level:<4}  {finding.check:<{width}}  {finding.says}")
        if finding.fix and finding.level != "ok":
            lines.append(f"{'':<4}  {'':<{width}}  fix: {finding.fix}")
    failed = [f.check for f in findings if f.level == "fail"]
    warned = [f.check for f in findings if f.level == "warn"]
    if failed:
        lines.append(f"not ready: fix {', '.join(failed)} first")
    elif warned:
        lines.append(f"ready, with less: see the fixes for {', '.join(warned)}")
    else:
        lines.append("ready")
    return "\n".join(lines)
