"""The benchmark's synthetic training job (GPU-emulated, or training a real model).

A real training loop over a real dataset on disk: ``adloader.DataLoader`` loads
JPEGs (decode, random crop, flip, normalise) or, for a job bound by reads, raw
samples read with O_DIRECT; the GPU step is emulated by sleeping for the batch's
compute time, or with ``--compute cuda`` trains a zoo model on the batch on the GPU,
held to that compute time (bench/gpu_step.py). It runs until ``--samples`` samples are done (as many epochs as
that takes) and writes its timeline, when each batch arrived and how long the
loop waited for it, to ``--timeline`` for the benchmark to score.

The emulated GPU is busy exactly ``--compute-ms`` per batch. When the process
wakes late from its sleep (its cgroup's CPU quota ran out, or the CPU is
contended), that overrun is GPU idle time: the next step could not be launched.
It is recorded separately and never counted as busy.

With ``--eval-every-steps N``, every N training steps the job evaluates: it takes
``--eval-batches`` batches from a second DataLoader over the same samples (unshuffled, as a
validation set is), each followed by a forward pass of ``--eval-compute-ms``. Those passes
count as busy; the evaluation's samples do not count towards ``--samples``.

    python -m bench.job --dataset DIR --image-px 224 --batch-size 32 \\
        --compute-ms 50 --samples 4000 --num-workers 4 --timeline OUT.json [--io-bound]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from bench.gpu_step import COMPUTE_MODES, DEFAULT_MODEL, HeldStep, ModelStep, sleep_step

TIMELINE_VERSION = 1

TRAINING_ONLY = (resource.RUSAGE_SELF,)
"""The job's own process, without its loader's workers: what ``training_cpu_s`` counts."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.job", description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="job")
    parser.add_argument("--dataset", type=Path, required=True, help="cache directory of the samples")
    parser.add_argument("--image-px", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--compute-ms", type=float, required=True, help="emulated GPU time per batch")
    parser.add_argument("--samples", type=int, required=True, help="stop after this many samples")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--io-bound", action="store_true", help="raw samples read with O_DIRECT")
    parser.add_argument("--timeline", type=Path, required=True, help="where to write the timeline JSON")
    parser.add_argument("--phase-after-s", type=float, default=None,
                        help="change phase this long after the start: each sample is loaded --phase-cost times")
    parser.add_argument("--phase-cost", type=int, default=1)
    parser.add_argument("--first-phase-cost", type=int, default=1,
                        help="each sample is loaded this many times until --phase-after-s")
    parser.add_argument("--python-ms-per-batch", type=float, default=0.0,
                        help="pure-Python work per batch in this process before the batch is ready")
    parser.add_argument("--eval-every-steps", type=int, default=None,
                        help="evaluate every this many training steps, on a second DataLoader")
    parser.add_argument("--eval-batches", type=int, default=0, help="batches an evaluation takes")
    parser.add_argument("--eval-compute-ms", type=float, default=0.0, help="emulated forward pass per eval batch")
    parser.add_argument("--compute", choices=COMPUTE_MODES[1:], default="sleep",
                        help="the GPU step: a sleep (GPU-emulated), or --model trained on the batch on cuda or cpu")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the zoo model --compute cuda/cpu trains")
    return parser.parse_args(argv)


def build_dataset(args: argparse.Namespace):
    if args.io_bound:
        from bench.rawread import RawFolder

        return RawFolder(args.dataset, px=args.image_px)
    from bench.datasets import JpegFolder

    return JpegFolder(args.dataset)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from adloader import DataLoader

    started = time.time()
    held = None if args.compute == "sleep" else HeldStep(ModelStep(args.model, args.compute))
    dataset = build_dataset(args)
    if args.phase_after_s is not None:  # bench/runner.py passes it only to a job that loads samples repeatedly
        from bench.datasets import Phased

        dataset = Phased(dataset, from_wall_s=started + args.phase_after_s, cost=args.phase_cost,
                         first_cost=args.first_phase_cost)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
        drop_last=len(dataset) >= args.batch_size, persistent_workers=args.num_workers > 0,
        pin_memory=args.compute == "cuda",
    )
    evaluation = None
    if args.eval_every_steps and args.eval_batches > 0:
        evaluation = DataLoader(
            build_dataset(args), batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers,
            persistent_workers=args.num_workers > 0,
        )
    loop = GpuLoop(time.monotonic(), args.python_ms_per_batch / 1000.0, held or sleep_step)
    cpu_at_start, own_cpu_at_start = _cpu_seconds(), _cpu_seconds(TRAINING_ONLY)
    loop_start_wall = time.time()
    samples = training_steps = 0
    while samples < args.samples:
        iterator = iter(loader)
        while samples < args.samples:
            batch = loop.step(iterator, args.compute_ms / 1000.0)
            if batch is None:
                break
            samples += samples_in(batch)
            training_steps += 1
            if evaluation is not None and training_steps % args.eval_every_steps == 0:
                evaluate = iter(evaluation)
                for _ in range(args.eval_batches):
                    if loop.step(evaluate, args.eval_compute_ms / 1000.0) is None:
                        break
                del evaluate
        del iterator
    loop_end = time.monotonic()
    del loader, evaluation  # joins the workers, so their CPU time is in RUSAGE_CHILDREN below
    steps = loop.steps
    timeline = {
        "version": TIMELINE_VERSION,
        "name": args.name,
        "pid": os.getpid(),
        "process_start": started,
        "loop_start": loop_start_wall,
        "loop_s": loop_end - loop.start,
        "samples": samples,
        "batch_size": args.batch_size,
        "compute_ms_per_batch": args.compute_ms,
        "busy_s": sum(s[2] for s in steps),
        "wait_s": sum(s[1] for s in steps),
        "sleep_overrun_s": loop.overrun_s,
        "compute": args.compute,
        "gpu_late_s": held.late_s if held is not None else 0.0,
        "cpu_s": _cpu_seconds() - cpu_at_start,
        "training_cpu_s": _cpu_seconds(TRAINING_ONLY) - own_cpu_at_start,
        "torch_threads": torch.get_num_threads(),
        "steps": steps,
        "steps_fields": ["t_s", "wait_s", "compute_s"],
    }
    args.timeline.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.timeline.with_suffix(".tmp")
    temporary.write_text(json.dumps(timeline, separators=(",", ":")))
    temporary.replace(args.timeline)
    return 0


class GpuLoop:
    """The training loop's steps: wait for a batch, do the loop's Python work, then the GPU
    step (``gpu_step(batch, compute_s)``: a sleep, or bench/gpu_step.py's held model step).
    Records each step as (seconds since ``start``, its wait for the batch, its compute) and the
    seconds the process woke late from its sleeps."""

    def __init__(self, start: float, python_s_per_batch: float,
                 gpu_step: Callable[[Any, float], None] = sleep_step) -> None:
        self.start = start
        self.python_s_per_batch = python_s_per_batch
        self.gpu_step = gpu_step
        self.steps: list[tuple[float, float, float]] = []
        self.overrun_s = 0.0

    def step(self, iterator: Iterator[object], compute_s: float) -> object | None:
        """One step on the next batch of ``iterator``: the batch, or None at its end."""
        asked = time.monotonic()
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        python_work(self.python_s_per_batch)
        got = time.monotonic()
        self.gpu_step(batch, compute_s)
        self.overrun_s += max(0.0, time.monotonic() - got - compute_s)
        self.steps.append((round(got - self.start, 4), round(got - asked, 4), compute_s))
        return batch


def python_work(seconds: float) -> None:
    """Single-threaded pure-Python work (holds the GIL) for ``seconds`` of this process's CPU."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(200))


def _cpu_seconds(whose: tuple[int, ...] = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) -> float:
    """CPU time of this process and of its reaped descendants (the loader's workers); of this
    process alone (its training: the loop, its kernel launches, pinning) with ``whose=(RUSAGE_SELF,)``."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, whose))


def samples_in(batch: object) -> int:
    """Samples in a collated batch: the leading dimension of its first tensor."""
    while isinstance(batch, (list, tuple)):
        batch = batch[0]
    if isinstance(batch, dict):
        return samples_in(next(iter(batch.values())))
    return int(batch.shape[0])  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
