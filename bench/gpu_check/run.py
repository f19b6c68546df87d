"""Run the parts in turn, each within its budget, and write what they found as data.

A part that fails or runs out of time records its error in the summary and the run goes on:
a lent machine is precious, nothing may be lost to one exception. After every part the raw
result is written to ``DIR/<part>.json`` and ``DIR/summary.json`` is rewritten, so an
interrupted run keeps what it measured.
"""
from __future__ import annotations

import json
import signal
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.gpu_check import data_wait, model_fit, node_check, overhead, resize
from bench.gpu_check.device import CheckDevice
from bench.gpu_check.environment import describe
from bench.gpu_check.plan import BUDGETS_S, TOTAL_BUDGET_S, Sizes
from bench.node import CACHE_DIR
from throughput_model.zoo import zoo_model


MIN_PART_S = 10.0
"""A part with less time left than this (or than its budget, if smaller) is skipped: it could not finish."""


class PartTimeout(BaseException):
    """A part ran past its budget. Not an ``Exception``: code that catches every error to keep
    going (a reporter, a cleanup) must not swallow the stop."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`PartTimeout` in this (the main) thread after ``seconds``."""
    def expired(signum: int, frame: Any) -> None:
        raise PartTimeout(f"stopped at its budget of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def seconds_left() -> float:
    """Seconds left of the running part's budget: what :func:`deadline`'s timer has still to run."""
    return signal.getitimer(signal.ITIMER_REAL)[0]


def parts(device: CheckDevice, sizes: Sizes, out: Path, progress: Callable[[str], None]
          ) -> dict[str, Callable[[], dict]]:
    """Each part as a call, in the order they run (the node benchmark, the longest, last, keeping
    its result so far in DIR/node.json as it goes)."""
    points = None if sizes.model_points is None else [(zoo_model(name), batch) for name, batch in sizes.model_points]
    return {
        "data_wait": lambda: data_wait.run(device, sizes.data_wait_steps, progress=progress),
        "overhead": lambda: overhead.run(device, sizes.overhead_batches, sizes.overhead_repeats,
                                                  progress=progress),
        "resize": lambda: resize.run(device, sizes.resize_samples, progress=progress),
        "throughput_model": lambda: model_fit.run(device, sizes.model_budget_s, points, steps=sizes.model_steps,
                                                  progress=progress),
        "node": lambda: node_check.run(sizes.node_mix, sizes.node_scale, sizes.node_cpus, sizes.node_compute,
                                       CACHE_DIR, keep=lambda result: _write(out / "node.json", result),
                                       progress=progress, logs=out / "node-logs",
                                       time_left=seconds_left),
    }


SUMMARY_KEYS = {
    "data_wait": ("data_wait_error", "data_wait_error_vs_kernel_events", "cpu_timer_error", "floor", "truth"),
    "overhead": ("reporter_overhead", "goal", "met", "reporter_overhead_fast_switch", "step_timer_us",
                 "step_timer_fraction", "measures"),
    "resize": ("exactly_once", "pin_memory", "unpinned_batches", "resize_latency_median_s", "resize_latency_max_s",
               "samples", "schedule"),
    "throughput_model": ("points", "families", "prior_mean_ape", "prior_basis", "fitted_lofo_mean_ape",
                         "fitted_lofo_p90_ape", "roofline_prior_mean_ape"),
    "node": ("stages_done", "mix", "scale", "cpus", "jobs", "gpu_step", "shared_gpu", "adaptive_vs_static_gpu_busy",
                       "adaptive_vs_even_gpu_busy", "adaptive_vs_oracle_gpu_busy", "with_loaders_vs_static_gpu_busy",
                       "not_run", "gpu_busy", "settle_s", "gpu_late_s"),
}
"""What of each part's result goes into summary.json, under the part's name (the rest stays in
DIR/<part>.json)."""
HEADLINES = {"data_wait_error": "data_wait", "reporter_overhead": "overhead"}
"""The figures summary.json also holds at its top level, and the part each comes from."""


def run_all(device: CheckDevice, sizes: Sizes, out: Path, only: list[str] | None = None,
            budgets: dict[str, float] = BUDGETS_S, progress: Callable[[str], None] = print,
            calls: dict[str, Callable[[], dict]] | None = None, total_s: float = TOTAL_BUDGET_S) -> dict[str, Any]:
    """Every part (or ``only`` those), each within its budget and what is left of ``total_s``; the
    summary, also in DIR/summary.json. ``calls``: the parts to run instead of :func:`parts` (tests)."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary: dict[str, Any] = {**describe(device.name, device.emulated), "parts": {}}
    if device.emulated:
        summary["note"] = ("dry run: no GPU; the device is emulated (a thread sleeping through queued work) and the "
                           "CPU clock stands in for CUDA events; no figure here is a GPU's")
    for name, call in (calls or parts(device, sizes, out, progress)).items():
        if only and name not in only:
            continue
        left = total_s - (time.monotonic() - started)
        budget = min(budgets[name], left)
        if left < min(budgets[name], MIN_PART_S):
            summary["parts"][name] = {"status": "skipped", "error": f"no time left of the {total_s:.0f} s"}
            progress(f"  {name} skipped: no time left")
            continue
        progress(f"[{time.monotonic() - started:5.0f} s] {name} (budget {budget:.0f} s)")
        part_started = time.monotonic()
        raw = out / f"{name}.json"
        raw.unlink(missing_ok=True)  # a part may keep its result so far there as it goes
        status: dict[str, Any] = {"status": "ok"}
        try:
            with deadline(budget):
                result = call()
            _write(raw, result)
            summary[name] = {key: result.get(key) for key in SUMMARY_KEYS.get(name, result)}
        except (Exception, PartTimeout) as exc:  # noqa: BLE001 - see the module docstring
            status = {"status": "timeout" if isinstance(exc, PartTimeout) else "error",
                      "error": f"{type(exc).__name__}: {exc}"[:500]}
            (out / f"{name}.error.txt").write_text(traceback.format_exc())
            progress(f"  {name} FAILED: {status['error']}")
            if raw.exists():
                kept = json.loads(raw.read_text())
                summary[name] = {"partial": True, **{key: kept.get(key) for key in SUMMARY_KEYS.get(name, kept)}}
        status["seconds"] = round(time.monotonic() - part_started, 1)
        summary["parts"][name] = status
        summary["wall_s"] = round(time.monotonic() - started, 1)
        _write(out / "summary.json", summary)
    for key, part in HEADLINES.items():
        summary[key] = summary.get(part, {}).get(key)
    summary["ok"] = all(part["status"] == "ok" for part in summary["parts"].values())
    summary["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write(out / "summary.json", summary)
    return summary


def _write(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1, default=str) + "\n")
    temporary.replace(path)
