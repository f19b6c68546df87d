"""GPU idle in each job's first seconds: starting from an even share, from a predicted M,
and from the node's memory of a recurring job (``adloader bench --prediction-start``).

The same mix runs under ``adaptive`` three ways, interleaved:

- ``even-start``: jobs send no model features and the node has no history, so each job
  holds an even share until its own measurements (M after a few steps, its loading cost
  after two reports) give the policy a model;
- ``predicted``: jobs send their model's features (bench/model_jobs.py), so M is
  predicted at registration; the loading cost still has to be measured;
- ``recurring``: features sent and the node's history primed by one earlier run of the
  mix (not scored): M comes from the prediction corrected by history, and the loading
  cost from the job's earlier run, so the first allocation is already sized.

Scored per run: the GPU-weighted idle fraction of each job's first ``window_s`` seconds of
training (from its first batch request; imports and worker start-up are the same in every
variant), and of the rest of its run (``after_window``: whether the start left any harm).
GPU-emulated: each GPU step is a sleep of the model's step time on this CPU.

A wrong prediction (``prediction_errors``, default -30 % and +30 %): each case runs the mix
with every model-naming job's emulated GPU step changed so that the unchanged prediction
from its features is that far off its true M (+30 %: predicted 1.3x the true M, the step is
1.3x longer), as ``even-start`` (no prediction) and ``predicted`` (the wrong one), interleaved.
Its first window says what the wrong start costs against no prediction at all; its later
idle, against even-start's, whether the measured curve took over without harm.
"""
from __future__ import annotations

import logging
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from bench import report
from bench.mix import Mix
from bench.model_jobs import check_models
from bench.runner import NodeSetup, Progress, RunOutcome, run_policy

log = logging.getLogger(__name__)

VARIANTS: tuple[str, ...] = ("even-start", "predicted", "recurring")
OFF_VARIANTS: tuple[str, ...] = ("even-start", "predicted")
"""What a wrong prediction is compared with: no prediction at all."""
PREDICTION_ERRORS: tuple[float, ...] = (-0.3, 0.3)
WINDOW_S = 30.0


def first_window_idle(timeline: dict, window_s: float = WINDOW_S) -> float | None:
    """Idle fraction of the emulated GPU over the job's first ``window_s`` seconds of training
    (or its whole loop, if shorter); None without steps."""
    return window_idle(timeline, 0.0, window_s)


def window_idle(timeline: dict, start_s: float, end_s: float | None = None) -> float | None:
    """Idle fraction of the emulated GPU from ``start_s`` to ``end_s`` (default: the loop's end)
    seconds into the job's training; None without steps or when the loop ends before ``start_s``."""
    steps = timeline.get("steps") or []
    loop = float(timeline.get("loop_s", end_s if end_s is not None else 0.0))
    end = loop if end_s is None else min(end_s, loop)
    if not steps or end - start_s <= 0:
        return None
    busy = sum(max(0.0, min(end, t + compute) - max(start_s, t)) for t, _, compute in steps if t < end)
    return max(0.0, 1.0 - busy / (end - start_s))


def score(run: RunOutcome, window_s: float = WINDOW_S) -> dict[str, Any]:
    """Each job's idle fraction in the first window and after it, and their GPU-weighted means."""
    jobs = {}
    for outcome in run.jobs:
        idle = first_window_idle(outcome.timeline or {}, window_s)
        if idle is not None:
            jobs[outcome.spec.name] = {"gpus": outcome.spec.gpus, "idle_fraction": idle,
                                       "idle_after_window": window_idle(outcome.timeline or {}, window_s)}
    return {"gpu_idle_first_window": _weighted(jobs, "idle_fraction"),
            "gpu_idle_after_window": _weighted(jobs, "idle_after_window"), "jobs": jobs}


def _weighted(jobs: dict[str, dict[str, Any]], key: str) -> float | None:
    """GPU-weighted mean of ``key`` over the jobs that have it."""
    having = [j for j in jobs.values() if j.get(key) is not None]
    weights = sum(max(1, j["gpus"]) for j in having)
    return sum(max(1, j["gpus"]) * j[key] for j in having) / weights if weights else None


def off_mix(mix: Mix, error: float) -> Mix:
    """``mix`` with each model-naming job's true step changed so that its (unchanged) predicted M is
    ``error`` off the true M: predicted / true = 1 + error, so the step is (1 + error) x as long."""
    jobs = tuple(replace(j, compute_ms_per_batch=j.compute_ms_per_batch * (1.0 + error)) if j.model else j
                 for j in mix.jobs)
    return replace(mix, jobs=jobs, name=f"{mix.name}-predicted{error:+.0%}")


def compare(
    mix: Mix, repeats: int, node: NodeSetup, datasets: dict[str, Path], workdir: Path,
    progress: Progress | None = None, window_s: float = WINDOW_S,
    prediction_errors: Sequence[float] = PREDICTION_ERRORS,
) -> dict[str, Any]:
    """Run the three variants ``repeats`` times, interleaved, then each wrong-prediction case; the JSON document."""
    check_models(mix)
    if not any(spec.model for spec in mix.jobs):
        log.warning("no job of mix %s names a model: 'predicted' cannot differ from 'even-start'", mix.name)
    base = workdir / mix.name
    memory = base / "recurring-state"
    shutil.rmtree(memory, ignore_errors=True)
    log.info("priming the node's history with one unscored run of %s", mix.name)
    run_policy(mix, "adaptive", datasets, base, node, label="priming", state_dir=memory, progress=progress)
    runs: list[RunOutcome] = []
    for repeat in range(repeats):
        for variant in VARIANTS:
            runs.append(run_policy(
                mix, "adaptive", datasets, base, node, repeat=repeat, progress=progress, label=variant,
                send_features=variant != "even-start", state_dir=memory if variant == "recurring" else None,
            ))
    summary = _summary(runs, VARIANTS, window_s)
    even = summary["even-start"]["gpu_idle_first_window"]
    off = {}
    for error in prediction_errors:
        wrong = off_mix(mix, error)
        off_runs = [run_policy(wrong, "adaptive", datasets, base / wrong.name, node, repeat=repeat, progress=progress,
                               label=variant, send_features=variant != "even-start")
                    for repeat in range(repeats) for variant in OFF_VARIANTS]
        off[f"{error:+.0%}"] = {"prediction_error": error, "mix": wrong.to_dict(),
                                "variants": _summary(off_runs, OFF_VARIANTS, window_s)}
    return {
        "benchmark": f"GPU idle in each job's first {window_s:.0f} s of training under adaptive "
                     "(GPU-emulated: each GPU step is a sleep of the model's step time measured on this CPU)",
        "mix": mix.to_dict(),
        "node": {"cpus": node.cpus, "period_s": node.period_s, "read_bps": node.read_bps},
        "window_s": window_s,
        "repeats": repeats,
        "variants": summary,
        "ratios_vs_even_start": {v: (summary[v]["gpu_idle_first_window"] / even if even else None) for v in VARIANTS},
        "wrong_predictions": off,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _summary(runs: list[RunOutcome], variants: Sequence[str], window_s: float) -> dict[str, dict[str, Any]]:
    """Per variant: the median idle in the first window and after it over repeats, each repeat's scores, and
    the run summary."""
    runs_summary = report.summarise(runs)  # grouped by label: one entry per variant
    summary = {}
    for variant in variants:
        scored = [score(r, window_s) for r in runs if r.policy == variant]
        later = [s["gpu_idle_after_window"] for s in scored if s["gpu_idle_after_window"] is not None]
        summary[variant] = {
            "gpu_idle_first_window": statistics.median(s["gpu_idle_first_window"] for s in scored),
            "gpu_idle_after_window": statistics.median(later) if later else None,
            "repeats": scored,
            "run": runs_summary[variant],
        }
    return summary


def table(document: dict[str, Any]) -> str:
    """The comparison as a table for stdout."""
    window = document["window_s"]
    lines = [f"GPU-emulated: GPU idle in each job's first {window:.0f} s (GPU-weighted, median over repeats)",
             f"{'start':<11} {'idle':>6} {'vs even-start':>13}   per job (idle fraction)"]
    for variant in VARIANTS:
        entry = document["variants"][variant]
        ratio = document["ratios_vs_even_start"][variant]
        per_job = statistics_per_job(entry["repeats"])
        lines.append(f"{variant:<11} {entry['gpu_idle_first_window']:>6.3f} {ratio:>12.3f}x   "
                     + ", ".join(f"{name} {idle:.2f}" for name, idle in per_job.items()))
    for case, result in document.get("wrong_predictions", {}).items():
        lines.append(f"prediction {case} off the true M: GPU idle in the first {window:.0f} s / after it")
        for variant in OFF_VARIANTS:
            entry = result["variants"][variant]
            later = entry["gpu_idle_after_window"]
            lines.append(f"  {variant:<11} {entry['gpu_idle_first_window']:>6.3f} / "
                         + (f"{later:.3f}" if later is not None else "-"))
    return "\n".join(lines)


def statistics_per_job(scored: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each job's median idle fraction over repeats."""
    names = sorted({name for s in scored for name in s["jobs"]})
    return {name: statistics.median(s["jobs"][name]["idle_fraction"] for s in scored if name in s["jobs"])
            for name in names}
