"""Micro-benchmark: how long one allocation takes, for a node with many jobs.

The controller calls its policy once per period; ``adaptive`` and ``jct`` solve a
linear program each time. Goal: one allocation for 100 jobs in under 20 ms. Jobs are
drawn from a seeded generator (heterogeneous GPUs, M, curves with one to four knots,
some reading from the device) and half of them carry a current allocation, as in a
running controller. Run: ``python -m bench.micro_policy [--jobs 100] [--json FILE]``.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

from bench import machine
from controller.policies import JobView, NodeResources, make_policy

POLICIES = ("even", "adaptive", "jct")
GOAL_MS = 20.0


def synthetic_jobs(count: int, seed: int, cores: float) -> list[JobView]:
    """``count`` running jobs with measured models, reproducible from ``seed``."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        m = rng.uniform(50.0, 3000.0)
        need = rng.uniform(0.05, 3.0) * cores / max(1, count) * 4  # cores to saturate, around the node's share
        knots = sorted(rng.uniform(0.05, cores) for _ in range(rng.randint(1, 4)))
        slope = m / need
        curve = tuple((c, slope * c * (1.0 - 0.1 * k)) for k, c in enumerate(knots))
        jobs.append(
            JobView(
                job_id=f"j{i:05d}", name=f"job-{i % 17}", gpus=rng.choice([1, 1, 2, 4, 8]), max_throughput=m,
                loading_curve=curve, bytes_per_sample=rng.choice([0.0, 0.0, 0.0, 2e5]),
                remaining_samples=rng.uniform(1e3, 1e6),
            )
        )
    return jobs


def time_allocation(policy_name: str, node: NodeResources, jobs: Sequence[JobView], repeats: int) -> list[float]:
    """Seconds per ``allocate`` call, ``repeats`` times (after one warm-up call)."""
    policy = make_policy(policy_name)
    first = policy.allocate(node, jobs)
    running = [
        JobView(**{**job.__dict__, "current": first[job.job_id]}) if i % 2 else job for i, job in enumerate(jobs)
    ]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.allocate(node, running)
        times.append(time.perf_counter() - start)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro_policy", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[16, 100, 300])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--cores", type=int, default=64, help="cores of the simulated node (default 64)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    node = NodeResources(cpus=tuple(range(args.cores)), read_bps=2e9, read_device="254:0")
    rows = []
    print(f"{'policy':<10} {'jobs':>5} {'median ms':>10} {'p95 ms':>8}")
    for count in args.jobs:
        jobs = synthetic_jobs(count, args.seed, node.cores)
        for name in POLICIES:
            times = sorted(time_allocation(name, node, jobs, args.repeats))
            median_ms = statistics.median(times) * 1e3
            p95_ms = times[min(len(times) - 1, int(0.95 * len(times)))] * 1e3
            rows.append({"policy": name, "jobs": count, "median_ms": median_ms, "p95_ms": p95_ms})
            print(f"{name:<10} {count:>5} {median_ms:>10.2f} {p95_ms:>8.2f}")
    at_100 = [r for r in rows if r["jobs"] == 100 and r["policy"] == "adaptive"]
    if at_100:
        verdict = "met" if at_100[0]["median_ms"] < GOAL_MS else "MISSED"
        print(f"goal: one adaptive allocation for 100 jobs < {GOAL_MS:.0f} ms: {verdict} ({at_100[0]['median_ms']:.2f} ms)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "policy allocation time", "node_cores": args.cores, "repeats": args.repeats,
            "machine": machine.describe(),
            "goal_ms_for_100_jobs": GOAL_MS, "results": rows,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
