"""``python -m bench.disk_readers``: how fast one O_DIRECT reader reads with 1, 2, 4 and 8
workers on this machine's disk (GPU-emulated: the job's GPU step is a sleep).

Whether more reads in flight help is the disk's to say: an NVMe drive reads faster the
more reads are queued, and this project's VM disk read slower. The controller measures it
per reader (controller/policies/shares.reader_workers); the simulator (bench/sim_node.py)
replays the 2-core mixes with this curve as its disk, since static runs each reader with
the workers it asked for. One job alone under ``static`` per worker count, the counts
interleaved within each repeat; reported: the reader's bytes/s over its training loop
(samples x sample bytes / loop seconds) and its GPU busy fraction, medians over repeats.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench import machine, report
from bench.mix import JobSpec, Mix
from bench.node import CACHE_DIR, node_setup, prepare_datasets
from bench.runner import run_policy

WORKERS = (1, 2, 4, 8)
READER = JobSpec(name="reader", gpus=2, batch_size=64, compute_ms_per_batch=47.7, image_px=512, samples=12_000,
                 arrival_s=0.0, num_workers=1, io_bound=True)
"""The reader of seeded random mix 15 (2 GPUs): 64 raw 512 px samples (768 KiB each) a batch,
1342 samples/s (1.06 GB/s) if reads never stalled, more than this disk gives."""


def lone_reader(workers: int, spec: JobSpec = READER) -> Mix:
    """A mix of ``spec`` alone, asking for ``workers`` workers."""
    job = dataclasses.replace(spec, name=f"{spec.name}-w{workers}", num_workers=workers)
    return Mix(jobs=(job,), name=f"lone-reader-w{workers}", description="one O_DIRECT reader alone")


def measure(workers: Sequence[int], repeats: int, cache: Path, workdir: Path, spec: JobSpec = READER) -> dict[str, Any]:
    """Run ``spec`` alone at each worker count ``repeats`` times, interleaved; the JSON document."""
    mixes = {w: lone_reader(w, spec) for w in workers}
    node = node_setup(mixes[workers[0]], "0-1", None, cache)
    datasets = {w: prepare_datasets(mix, cache) for w, mix in mixes.items()}
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in workers}
    for repeat in range(repeats):
        for w in workers:
            outcome = run_policy(mixes[w], "static", datasets[w], workdir / mixes[w].name, node, repeat=repeat)
            job = outcome.jobs[0]
            timeline = job.timeline or {}
            loop_s, busy_s = float(timeline.get("loop_s", 0.0)), float(timeline.get("busy_s", 0.0))
            rate = job.spec.samples / loop_s if loop_s > 0 else 0.0
            read_bps = rate * job.spec.raw_sample_bytes
            runs[w].append({"read_bps": read_bps, "samples_per_s": rate,
                            "gpu_busy": busy_s / loop_s if loop_s > 0 else 0.0, "loop_s": loop_s})
            print(f"  repeat {repeat + 1}/{repeats}, {w} worker(s): {read_bps / 1e6:.0f} MB/s", flush=True)
    return {
        "benchmark": "one O_DIRECT reader alone by worker count (GPU-emulated: its GPU step is a sleep)",
        "machine": machine.describe() | {"read_device": node.read_device},
        "reader": {**dataclasses.asdict(spec), "sample_bytes": spec.raw_sample_bytes},
        "repeats": repeats,
        "workers": {str(w): {key: statistics.median(r[key] for r in runs[w]) for key in runs[w][0]} | {"runs": runs[w]}
                    for w in workers},
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def table(document: dict[str, Any]) -> str:
    lines = ["GPU-emulated: one O_DIRECT reader alone, medians over repeats",
             f"{'workers':>7} {'MB/s':>7} {'samples/s':>9} {'GPU busy':>8} {'vs 1 worker':>11}"]
    base = document["workers"][min(document["workers"], key=int)]["read_bps"]
    for w, v in sorted(document["workers"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"{w:>7} {v['read_bps'] / 1e6:>7.0f} {v['samples_per_s']:>9.0f} {v['gpu_busy']:>8.3f} "
                     f"{v['read_bps'] / base:>10.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)), help="comma-separated worker counts")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/adloader-bench"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    workers = [int(w) for w in args.workers.split(",")]
    document = measure(workers, args.repeats, args.cache, args.workdir)
    print(table(document))
    if args.json:
        report.write_json(args.json, document)
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
