"""Is the reporter's data-wait fraction right under asynchronous kernels? Checked per case.

Each case runs twice over the same loader shape. The measured run is a training loop as
written: ``next()``, then the step's kernels queued asynchronously; the reporter's fraction
is what adloader.DataLoader's counters say (device markers, read lazily), and beside it
what a wall-clock timer around ``next()`` says (what the reporter said before it read the
device). The truth run synchronises the device before and after every ``next()`` and
times the device's idle gap with markers of its own: nothing is queued while it waits, so
the gap is exactly the time the device sat idle for data. The loaders load in workers, so
both runs overlap loading with compute alike. The synchronised ``next()`` also counts as idle
the CPU time of taking a ready batch, which the measured run hides behind its kernels; so the
measured run carries a second, unperturbed truth: markers of its own just before and after
each step's kernels, the device idle between one step's last kernel and the next one's first
(``kernel_events_fraction``).

Cases: a starved loader (loading is slower than the kernels), a loader that keeps up, and
kernels that outlast the step's Python (queued at once, they run while ``next()`` blocks:
a wall-clock timer calls that whole block a wait).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from adloader import DataLoader
from adloader.dataloader.stats import LoaderCounters, StepTimer
from bench.gpu_check.device import CheckDevice

FLOOR = 0.05
"""A fraction below this is judged against it: a relative error of two near-zero waits means nothing."""


@dataclass(frozen=True)
class Case:
    name: str
    load_ms: float
    """Loading time of one batch in a worker (a sleep: the worker is busy, not the GPU)."""
    kernels_ms: float
    workers: int


CASES = (
    Case("starved", load_ms=60.0, kernels_ms=15.0, workers=1),
    Case("keeps_up", load_ms=15.0, kernels_ms=30.0, workers=2),
    Case("kernels_outlast_python", load_ms=30.0, kernels_ms=60.0, workers=1),
)


class SleepyBatches(torch.utils.data.Dataset):
    """Sample i is ``tensor(i)``, after ``delay`` seconds of loading."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.tensor(index)


def relative_error(measured: float, truth: float) -> float:
    """|measured - truth| relative to the truth, the truth taken as at least :data:`FLOOR`."""
    return abs(measured - truth) / max(truth, FLOOR)


def fraction(counters: LoaderCounters) -> float:
    total = counters.data_wait_s + counters.compute_s
    return counters.data_wait_s / total if total > 0 else 0.0


def _difference(after: LoaderCounters, before: LoaderCounters) -> LoaderCounters:
    return LoaderCounters(data_wait_s=after.data_wait_s - before.data_wait_s,
                          compute_s=after.compute_s - before.compute_s)


def _loader(case: Case, steps: int, device: CheckDevice) -> DataLoader:
    loader = DataLoader(SleepyBatches(steps, case.load_ms / 1000.0), batch_size=1, num_workers=case.workers)
    if device.emulated:
        loader.step_events = device.events  # on CUDA the loader's own default (CUDA events) is what is checked
    return loader


def measured_run(case: Case, device: CheckDevice, warmup: int, steps: int) -> dict[str, Any]:
    """The loop as written; the reporter's fraction and a wall-clock timer's over ``steps`` steps."""
    loader = _loader(case, warmup + steps, device)
    wall = LoaderCounters()
    wall_timer = StepTimer(wall)
    kernels = []
    try:
        iterator = iter(loader)
        for index in range(warmup + steps):
            if index == warmup:
                device.synchronize()
                loader.settle_step_timing()
                reporter_before, wall_before = loader.counters.copy(), wall.copy()
            wall_timer.enter()
            batch = next(iterator)
            wall_timer.leave(delivered=True)
            first = device.record()
            device.compute(case.kernels_ms / 1000.0)
            if index >= warmup:
                kernels.append((first, device.record()))
            del batch
        wall_timer.enter()  # the wall clock counts the last step's compute here
        device.synchronize()
        loader.settle_step_timing()
        reporter = _difference(loader.counters, reporter_before)
        cpu_timer = _difference(wall, wall_before)
        on_device = bool(loader._timer is not None and loader._timer.on_device)  # noqa: SLF001 - the check's subject
    finally:
        loader.close()
    busy_ms = sum(a.elapsed_time(b) for a, b in kernels)
    span_ms = kernels[0][0].elapsed_time(kernels[-1][1])
    return {"reporter_fraction": fraction(reporter), "cpu_timer_fraction": fraction(cpu_timer),
            "kernel_events_fraction": 1.0 - busy_ms / span_ms,
            "reporter_on_device": on_device, "reporter_wait_s": reporter.data_wait_s,
            "reporter_compute_s": reporter.compute_s}


def truth_run(case: Case, device: CheckDevice, warmup: int, steps: int) -> dict[str, Any]:
    """The device synchronised around every ``next()``: its idle gaps over ``steps`` steps."""
    loader = _loader(case, warmup + steps, device)
    gaps = []
    try:
        iterator = iter(loader)
        for index in range(warmup + steps):
            device.synchronize()
            if index == warmup:
                start = device.record()
            before = device.record()
            batch = next(iterator)
            after = device.record()
            device.synchronize()
            if index >= warmup:
                gaps.append((before, after))
            device.compute(case.kernels_ms / 1000.0)
            del batch
        end = device.record()
        device.synchronize()
    finally:
        loader.close()
    idle_ms = sum(a.elapsed_time(b) for a, b in gaps)
    total_ms = start.elapsed_time(end)
    return {"truth_fraction": idle_ms / total_ms, "truth_idle_s": idle_ms / 1000.0, "truth_total_s": total_ms / 1000.0}


def check_case(case: Case, device: CheckDevice, warmup: int, steps: int) -> dict[str, Any]:
    measured = measured_run(case, device, warmup, steps)
    truth = truth_run(case, device, warmup, steps)
    return {**asdict(case), "steps": steps, **measured, **truth,
            "error": relative_error(measured["reporter_fraction"], truth["truth_fraction"]),
            "error_vs_kernel_events": relative_error(measured["reporter_fraction"], measured["kernel_events_fraction"]),
            "cpu_timer_error": relative_error(measured["cpu_timer_fraction"], truth["truth_fraction"])}


def run(device: CheckDevice, steps: int, warmup: int = 4, progress=print) -> dict[str, Any]:
    """Every case; ``data_wait_error`` is the largest reporter error over them."""
    cases = []
    for case in CASES:
        result = check_case(case, device, warmup, steps)
        progress(f"  data wait, {case.name}: reporter {result['reporter_fraction']:.3f}, wall clock "
                 f"{result['cpu_timer_fraction']:.3f}, truth {result['truth_fraction']:.3f}")
        cases.append(result)
    truth = ("the emulated device's markers (the CPU clock stands in for CUDA events)" if device.emulated
             else "CUDA events, the stream synchronised before and after every next()")
    return {"data_wait_error": max(c["error"] for c in cases),
            "data_wait_error_vs_kernel_events": max(c["error_vs_kernel_events"] for c in cases),
            "cpu_timer_error": max(c["cpu_timer_error"] for c in cases),
            "floor": FLOOR, "truth": truth, "cases": cases}
