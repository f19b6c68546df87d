"""``adloader demo``: the shipped job mix, shortened, under ``adaptive`` and ``even``.

The README's first command. Five GPU-emulated training jobs (real processes
started through ``adloader run``, real JPEG decoding, one job bound by disk reads)
share this machine's cores and read bandwidth, first under A-Dloader's even split,
then under adloader's adaptive policy; a live line shows each job's cores and
speed, and the run ends with the comparison table and the path of the plot.
About two and a half minutes on two cores.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from adloader.status import cores_text, effective_cores
from bench import report
from bench.mix import DEFAULT_MIX, load_mix
from bench.node import CACHE_DIR, QUICK_SCALE, benchmark, node_setup
from bench.runner import JobOutcome

POLICIES = ("even", "adaptive")
QUICK_DEMO_SCALE = 0.1
"""--quick: jobs a tenth as long as the full benchmark's, to check an install works (about a minute);
its ratios are too short-lived to quote."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("It ends with one sentence of what adaptive did against even, the goals each met or missed,\n"
                     "and a table, whose columns are:\n" + "\n".join(f"  {line}" for line in report.legend(["even"])))
    parser.add_argument("--mix", type=Path, default=DEFAULT_MIX, metavar="FILE", help="job mix (default: shipped)")
    parser.add_argument("--scale", type=float, default=None,
                        help=f"job length relative to the full benchmark (default {QUICK_SCALE:g})")
    parser.add_argument("--quick", action="store_true",
                        help=f"jobs {QUICK_DEMO_SCALE:g}x as long as the full benchmark's: checks that an install "
                        "works, in about a minute (too short for figures)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/adloader-demo"),
                        help="where the plot, the JSON and the run logs go (default /tmp/adloader-demo)")


def main(args: argparse.Namespace) -> int:
    """A bad mix or no cgroups: an AdloaderError, which the dispatcher reports in one line."""
    scale = args.scale if args.scale is not None else QUICK_DEMO_SCALE if args.quick else QUICK_SCALE
    mix = load_mix(args.mix).scaled(scale)
    node = node_setup(mix, "0-1", None, CACHE_DIR)  # the controller's default periods
    print(f"adloader demo (GPU-emulated): {len(mix.jobs)} jobs of mix {mix.name!r} on CPUs {node.cpus}, "
          f"read budget {node.read_bps / 1e6:.0f} MB/s of {node.read_device}; policies {', '.join(POLICIES)}")
    for spec in mix.jobs:
        kind = f"raw {spec.image_px}px via O_DIRECT" if spec.io_bound else f"JPEG {spec.image_px}px"
        print(f"  {spec.name:<14} {spec.gpus} GPU, arrives {spec.arrival_s:4.0f}s, {kind}, "
              f"batch {spec.batch_size}, GPU step {spec.compute_ms_per_batch:.0f} ms, {spec.samples} samples")
    live = LiveLine()
    runs, document = benchmark(mix, POLICIES, 1, node, CACHE_DIR, args.out / "runs", progress=live)
    live.finish()
    print()
    print(report.table(document["policies"], POLICIES))
    print()
    for line in report.legend([b for b in report.BASELINES if b in document["policies"]]):
        print(f"  {line}")
    print()
    sentence = report.headline(document)
    if sentence:
        print(sentence + ".")
    for line in report.goal_sentences(document):
        print(f"  {line}")
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(args.out / "demo.json", document)  # first: a missing plotting library loses nothing
    print(f"results: {args.out / 'demo.json'}")
    plot_path = args.out / "demo.png"
    report.plot(plot_path, runs, POLICIES, f"adloader demo, {mix.name} ({scale:g}x length)")
    print(f"plot: {plot_path}")
    return 0


class LiveLine:
    """Redraws one status line per poll: policy, time, and each job's CPU and GPU idle in the words
    and forms of ``adloader status`` (CORES: a quota, or ``~`` the share a WEIGHT gives; GPU IDLE)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last_policy: str | None = None
        self.width = shutil.get_terminal_size((120, 20)).columns

    def __call__(self, policy: str, elapsed: float, jobs: list[JobOutcome], snapshot: Any) -> None:
        if policy != self.last_policy:
            self.finish()
            print(f"running {policy} ...")
            self.last_policy = policy
        parts = []
        by_name = {j.name: j for j in snapshot.jobs} if snapshot is not None else {}
        shares = effective_cores(snapshot) if snapshot is not None else {}
        for outcome in jobs:
            name = outcome.spec.name
            if outcome.ended_s is not None:
                parts.append(f"{name} done")
                continue
            job = by_name.get(name)
            if job is None or job.achieved_sps is None:
                parts.append(f"{name} starting")
                continue
            weight = f" weight {job.cpu_weight}" if job.cpu_weight is not None else ""
            idle = f"{job.gpu_idle_ratio:.0%}" if job.gpu_idle_ratio is not None else "-"
            parts.append(f"{name} cores {cores_text(job, shares.get(job.job_id))}{weight} gpu idle {idle}")
        line = f"  {elapsed:5.1f}s  " + " | ".join(parts)
        if self.tty:
            sys.stdout.write("\r" + line[: self.width - 1].ljust(self.width - 1))
            sys.stdout.flush()
        elif int(elapsed * 2) % 10 == 0:
            print(line)

    def finish(self) -> None:
        if self.tty and self.last_policy is not None:
            sys.stdout.write("\n")
            sys.stdout.flush()
