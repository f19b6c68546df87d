"""Benchmark: a training step that holds the GIL, over torch's DataLoader and adloader's.

    python -m bench.gil_step [--repeats 4] [--batches 300] [--json bench/results/gil_step.json]

A loop that launches a small model's kernels from Python holds the GIL for most of its step:
any work a loader does on a thread of the training process waits for it. This stands that loop
in on a machine without a GPU: each step spins in pure Python for ``--step-ms`` (6 ms, about
the H200 loop of ``python -m bench.gpu``'s overhead part), over batches that cost the workers
almost nothing, so the loader's hand-over is all that differs. torch's loader and adloader's
run interleaved, each in a fresh interpreter, at the same workers; reported are the wall
milliseconds a step takes (spin plus ``next()``) and the median ratio adloader / torch.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.gpu_check.overhead import Images
from bench.report import write_json

GOAL = 1.02


def spin(milliseconds: float) -> None:
    """Hold the GIL for ``milliseconds``, as a Python loop launching kernels does."""
    end = time.perf_counter() + milliseconds / 1000
    while time.perf_counter() < end:
        pass


def step_ms(loader_name: str, batches: int, spin_ms: float, workers: int, batch: int = 32) -> float:
    """Wall milliseconds a step takes over ``loader_name``'s loader (``torch`` or ``adloader``)."""
    if loader_name == "torch":
        loader_class: Any = torch.utils.data.DataLoader
    else:
        from adloader import DataLoader as loader_class
    loader = loader_class(Images((batches + 2) * batch), batch_size=batch, num_workers=workers)
    iterator = iter(loader)
    for _ in range(2):
        next(iterator)
        spin(spin_ms)
    started = time.perf_counter()
    for _ in iterator:
        spin(spin_ms)
    elapsed = time.perf_counter() - started
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return elapsed / batches * 1e3


def _in_fresh_interpreter(loader_name: str, batches: int, spin_ms: float, workers: int) -> float:
    code = ("import sys; from bench.gil_step import step_ms; "
            f"print(step_ms({loader_name!r}, {batches}, {spin_ms}, {workers}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout
    return float(out.strip().splitlines()[-1])


def run(repeats: int, batches: int, spin_ms: float, workers: int, progress=print) -> dict[str, Any]:
    rows = []
    for repeat in range(repeats):
        order = ("torch", "adloader") if repeat % 2 == 0 else ("adloader", "torch")
        measured = {name: _in_fresh_interpreter(name, batches, spin_ms, workers) for name in order}
        rows.append({"repeat": repeat, "order": list(order), **{f"{name}_step_ms": ms for name, ms in measured.items()},
                     "ratio": measured["adloader"] / measured["torch"]})
        progress(f"  repeat {repeat + 1}: torch {measured['torch']:.2f} ms, adloader {measured['adloader']:.2f} ms a step "
                 f"(x{rows[-1]['ratio']:.3f})")
    ratio = statistics.median(row["ratio"] for row in rows)
    return {"benchmark": "a GIL-holding training step over torch's loader and adloader's (bench/gil_step.py)",
            "step_ms": spin_ms, "batches": batches, "workers": workers, "repeats": repeats,
            "python": sys.version.split()[0], "torch": torch.__version__,
            "median_ratio_adloader_over_torch": ratio, "goal": f"<= {GOAL}", "met": ratio <= GOAL, "runs": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gil_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=6.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    result = run(args.repeats, args.batches, args.step_ms, args.workers)
    print(f"{'repeat':>6}  {'torch ms':>9}  {'adloader ms':>11}  {'ratio':>6}")
    for row in result["runs"]:
        print(f"{row['repeat'] + 1:>6}  {row['torch_step_ms']:>9.2f}  {row['adloader_step_ms']:>11.2f}  {row['ratio']:>6.3f}")
    print(f"median adloader / torch: {result['median_ratio_adloader_over_torch']:.3f} (goal {result['goal']}: "
          f"{'met' if result['met'] else 'missed'})")
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
