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
variant). GPU-emulated: each GPU step is a sleep of the model's step time on this CPU.
"""
from __future__ import annotations

import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from bench import report
from bench.mix import Mix
from bench.model_jobs import check_models
from bench.runner import NodeSetup, Progress, RunOutcome, run_policy

log = logging.getLogger(__name__)

VARIANTS: tuple[str, ...] = ("even-start", "predicted", "recurring")
WINDOW_S = 30.0


def first_window_idle(timeline: dict, window_s: float = WINDOW_S) -> float | None:
    """Idle fraction of the emulated GPU over the job's first ``window_s`` seconds of training
    (or its whole loop, if shorter); None without steps."""
    steps = timeline.get("steps") or []
    if not steps:
        return None
    span = min(window_s, float(timeline.get("loop_s", window_s)))
    if span <= 0:
        return None
    busy = sum(max(0.0, min(span, t + compute) - t) for t, _, compute in steps if t < span)
    return max(0.0, 1.0 - busy / span)


def score(run: RunOutcome, window_s: float = WINDOW_S) -> dict[str, Any]:
    """Each job's first-window idle fraction and their GPU-weighted mean."""
    jobs = {}
    for outcome in run.jobs:
        idle = first_window_idle(outcome.timeline or {}, window_s)
        if idle is not None:
            jobs[outcome.spec.name] = {"gpus": outcome.spec.gpus, "idle_fraction": idle}
    weights = sum(max(1, j["gpus"]) for j in jobs.values())
    weighted = sum(max(1, j["gpus"]) * j["idle_fraction"] for j in jobs.values()) / weights if weights else None
    return {"gpu_idle_first_window": weighted, "jobs": jobs}


def compare(
    mix: Mix, repeats: int, node: NodeSetup, datasets: dict[str, Path], workdir: Path,
    progress: Progress | None = None, window_s: float = WINDOW_S,
) -> dict[str, Any]:
    """Run the three variants ``repeats`` times, interleaved; the JSON document."""
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
    scores = {variant: [score(r, window_s) for r in runs if r.policy == variant] for variant in VARIANTS}
    runs_summary = report.summarise(runs)  # grouped by label: one entry per variant
    summary = {
        variant: {
            "gpu_idle_first_window": statistics.median(s["gpu_idle_first_window"] for s in scored),
            "repeats": scored,
            "run": runs_summary[variant],
        }
        for variant, scored in scores.items()
    }
    even = summary["even-start"]["gpu_idle_first_window"]
    return {
        "benchmark": f"GPU idle in each job's first {window_s:.0f} s of training under adaptive "
                     "(GPU-emulated: each GPU step is a sleep of the model's step time measured on this CPU)",
        "mix": mix.to_dict(),
        "node": {"cpus": node.cpus, "period_s": node.period_s, "read_bps": node.read_bps},
        "window_s": window_s,
        "repeats": repeats,
        "variants": summary,
        "ratios_vs_even_start": {v: (summary[v]["gpu_idle_first_window"] / even if even else None) for v in VARIANTS},
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


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
    return "\n".join(lines)


def statistics_per_job(scored: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each job's median idle fraction over repeats."""
    names = sorted({name for s in scored for name in s["jobs"]})
    return {name: statistics.median(s["jobs"][name]["idle_fraction"] for s in scored if name in s["jobs"])
            for name in names}
