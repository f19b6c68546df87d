"""``python -m bench.gpu --out DIR [--dry-run]``: adloader's GPU path, proven on a real GPU in one run.

On a CUDA machine it checks, in at most 8 minutes: the reporter's data-wait split under
asynchronous kernels against CUDA events, what adloader's measuring costs a training loop,
live worker resizes with ``pin_memory=True``, the throughput model on the device, and the
node benchmark with every job training a real model on the GPU. It writes ``DIR/summary.json``
and each part's raw data beside it (docs/gpu.md). ``--dry-run`` runs the same parts on the CPU
with an emulated device, at the smallest sizes, in under two minutes.

The first line printed says what this Python found (torch, its CUDA, the GPU): a lent machine
has its own Python and nothing can be installed there. ``--mount-cgroup-v1`` first mounts cgroup
v1 beside a machine's cgroup v2 (bench/gpu_check/cgroup_v1_beside_v2.sh; the node benchmark
drives the cgroup-v1 backend, and the lent machines have v2 only): only on a machine you may
reconfigure.
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path
from typing import Sequence

PARTS = ("data_wait", "overhead", "resize", "throughput_model", "node")
MOUNT_CGROUP_V1 = Path(__file__).resolve().parent / "gpu_check" / "cgroup_v1_beside_v2.sh"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where summary.json and the raw data go")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: the same parts on the CPU with an emulated device, smallest sizes")
    parser.add_argument("--parts", default=None, metavar="P,P,...",
                        help=f"run only these parts (of {','.join(PARTS)})")
    parser.add_argument("--mount-cgroup-v1", action="store_true",
                        help="first mount cgroup v1's cpu, cpuacct and cpuset beside cgroup v2 for the node part "
                             "(root; it takes those controllers from every v2 group: a throwaway machine only)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    only = args.parts.split(",") if args.parts else None
    if only and set(only) - set(PARTS):
        print(f"bench.gpu: unknown part(s) {sorted(set(only) - set(PARTS))}; the parts are {', '.join(PARTS)}",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.mount_cgroup_v1:
        mounted = subprocess.run(["sh", str(MOUNT_CGROUP_V1)], capture_output=True, text=True)
        print((mounted.stdout + mounted.stderr).strip(), flush=True)  # a failure shows again in the node part
    from bench.gpu_check.environment import GpuCheckError, require_torch

    try:
        require_torch()
        from bench.gpu_check.environment import found_line

        print(found_line(), flush=True)
        from bench.gpu_check.device import open_device
        from bench.gpu_check.plan import DRY_RUN, GPU
        from bench.gpu_check.run import run_all

        device = open_device(args.dry_run)
    except GpuCheckError as exc:
        print(f"bench.gpu: {exc}", file=sys.stderr)
        return 3
    summary = run_all(device, DRY_RUN if args.dry_run else GPU, args.out, only,
                      progress=lambda line: print(line, flush=True))
    print(f"bench.gpu: {'all parts ok' if summary['ok'] else 'some parts FAILED'}; data_wait_error "
          f"{summary['data_wait_error']}, reporter_overhead {summary['reporter_overhead']}; "
          f"{args.out / 'summary.json'}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
