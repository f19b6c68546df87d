"""How late a job's training process wakes from its GPU step when its job's CPU weight is low.

``adaptive`` gives a job its plan satisfies a large CPU weight (1000 plus 100 a core) and a
starved job the weight of its few planned cores, 30 times less on two cores. The starved job's
training process shares that weight with its own loader workers: on the node's crossing pair
(bench/mixes/crossing_pair_sharp.json) it woke 3-15 s late over a run from its emulated GPU
steps, against 0.4-0.8 s under ``even``, and its measured M fell to half its true value. On a
real GPU the same wait idles the device with a batch ready.

This measures that wait alone, with real cgroups through the controller's own cgroup v1
backend: two jobs, each with CPU-bound workers filling the node's cores; the "trainer" of the
low-weight job sleeps one GPU step at a time and records how late each sleep returns. Cells:
the low job at several weights against a satisfied neighbour, and the trainer kept apart from
its job's group as the controller keeps a rank whose loader runs workers (``backend.detach``,
controller/training_processes.py: back in the cgroup the job came from, here the root; its
workers still at the lowest weight), interleaved over the repeats. Needs root and the cgroup v1
cpu hierarchy.

Run alone: ``python -m bench.trainer_stall [--json bench/results/trainer_stall.json]``.
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Sequence

from bench import machine
from bench.report import write_json
from controller.backends.base import BackendError
from controller.backends.cgroup_v1 import CgroupV1Backend

log = logging.getLogger(__name__)

SATISFIED_NEIGHBOUR_WEIGHT = 1172
"""The neighbour's weight: what ``adaptive`` gave the satisfied job on the crossing pair."""
LOW_WEIGHTS = (36, 100, 200, 400, 1172)
"""The low job's weights (cgroup v2 scale): 36 as on the crossing pair, up to an equal weight."""
APART = "apart"
"""The cell whose trainer is kept apart from its job's group, as the controller does by default."""
GROUP = "adloader-stall-bench"


@dataclass(frozen=True)
class Cell:
    """One measurement: the low job's weight, and whether its trainer is in its own group."""

    low_weight: int
    trainer_apart: bool = False

    @property
    def label(self) -> str:
        return f"{self.low_weight}+{APART}" if self.trainer_apart else str(self.low_weight)


def _spin() -> None:
    """A loader worker that never waits: pure CPU."""
    x = 0
    while True:
        x += 1


def _trainer(step_s: float, duration_s: float, start: Connection, out: Connection) -> None:
    """Sleeps one GPU step at a time for ``duration_s`` once told to start; sends each step's overrun (s)."""
    start.recv()
    overruns = []
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        before = time.monotonic()
        time.sleep(step_s)
        overruns.append(time.monotonic() - before - step_s)
    out.send(overruns)


def measure(backend: CgroupV1Backend, cell: Cell, workers: int, step_s: float, duration_s: float) -> list[float]:
    """Each GPU step's overrun (s) of the low job's trainer in ``cell``: both jobs run ``workers``
    spinning workers, the neighbour at SATISFIED_NEIGHBOUR_WEIGHT."""
    ctx = multiprocessing.get_context("fork")
    jobs = {"high": SATISFIED_NEIGHBOUR_WEIGHT, "low": cell.low_weight}
    for job_id, weight in jobs.items():
        backend.create(job_id)
        backend.set_cpu_weight(job_id, weight)
    spinners = [ctx.Process(target=_spin, daemon=True) for _ in range(2 * workers)]
    start_recv, start_send = ctx.Pipe(duplex=False)
    out_recv, out_send = ctx.Pipe(duplex=False)
    trainer = ctx.Process(target=_trainer, args=(step_s, duration_s, start_recv, out_send), daemon=True)
    try:
        for i, process in enumerate(spinners):
            process.start()
            backend.attach("high" if i < workers else "low", process.pid)
        trainer.start()
        backend.attach("low", trainer.pid)
        if cell.trainer_apart:
            backend.detach("low", trainer.pid)
        time.sleep(0.5)  # the kernel's load averages settle on the new groups
        start_send.send(True)
        overruns: list[float] = out_recv.recv()
        trainer.join()
        return overruns
    finally:
        for process in [*spinners, trainer]:
            if process.is_alive():
                process.kill()
            process.join()
        for job_id in jobs:
            backend.remove(job_id)


def summary(overruns: Sequence[float], step_s: float) -> dict[str, float]:
    """Mean, median and p95 overrun per step (ms), and how much longer each step took."""
    ordered = sorted(overruns)
    return {
        "steps": float(len(ordered)),
        "mean_overrun_ms": 1000 * statistics.fmean(ordered),
        "median_overrun_ms": 1000 * statistics.median(ordered),
        "p95_overrun_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "step_stretch": 1.0 + statistics.fmean(ordered) / step_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_stall", description=__doc__.split("\n")[0])
    parser.add_argument("--step-ms", type=float, default=40.0, help="the emulated GPU step (default 40 ms)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each cell's length (default 5 s)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every cell (default 2)")
    parser.add_argument("--workers", type=int, default=None, help="spinning workers per job (default: the node's cores)")
    parser.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"))
    parser.add_argument("--json", type=Path, default=None, help="where to save the results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    workers = args.workers or len(os.sched_getaffinity(0))
    step_s = args.step_ms / 1000
    try:
        backend = CgroupV1Backend(group=GROUP, root=args.cgroup_root)
    except BackendError as exc:
        log.error("%s", exc)
        return 2
    cells = [Cell(w) for w in LOW_WEIGHTS] + [Cell(min(LOW_WEIGHTS), trainer_apart=True)]
    overruns: dict[str, list[float]] = {cell.label: [] for cell in cells}
    try:
        for repeat in range(args.repeats):
            for cell in cells:
                log.info("repeat %d/%d: low job at weight %s against %d", repeat + 1, args.repeats, cell.label,
                         SATISFIED_NEIGHBOUR_WEIGHT)
                overruns[cell.label] += measure(backend, cell, workers, step_s, args.seconds)
    finally:
        backend.remove_group()
    rows = {label: summary(values, step_s) for label, values in overruns.items()}
    print(f"\nTrainer wake-up overrun, {args.step_ms:g} ms steps, {workers} spinning workers a job, "
          f"neighbour at weight {SATISFIED_NEIGHBOUR_WEIGHT}:")
    print(f"{'low weight':>12} {'ratio':>7} {'steps':>6} {'mean ms':>8} {'median':>7} {'p95':>7} {'step x':>7}")
    for cell in cells:
        row = rows[cell.label]
        print(f"{cell.label:>12} {SATISFIED_NEIGHBOUR_WEIGHT / cell.low_weight:>6.1f}x {row['steps']:>6.0f} "
              f"{row['mean_overrun_ms']:>8.1f} {row['median_overrun_ms']:>7.1f} {row['p95_overrun_ms']:>7.1f} "
              f"{row['step_stretch']:>6.2f}x")
    if args.json is not None:
        document: dict[str, Any] = {
            "benchmark": "trainer wake-up overrun under a low CPU weight (real cgroup v1 groups, spinning workers)",
            "machine": machine.describe() | {"spinning_workers_per_job": workers, "load_average_at_start": os.getloadavg()},
            "step_ms": args.step_ms, "seconds_per_cell": args.seconds, "repeats": args.repeats,
            "neighbour_weight": SATISFIED_NEIGHBOUR_WEIGHT, "cells": rows,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        write_json(args.json, document)
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
