"""The node benchmark with real training: the mix's jobs train zoo models on the device.

The same benchmark as ``adloader bench`` (bench/node.py: a real controller per policy, real
jobs through ``adloader run`` over real JPEG loading), its jobs' GPU steps made by
bench/gpu_step.py: on a GPU every job trains a small zoo model on it, all of them sharing the
one device, each step held to the mix's compute time; the jobs' ``gpu_late_s`` says whether
the GPU ever was the limit. Reported: adaptive against static, even and the oracle (GPU busy),
each policy's GPU busy, and adaptive's settling time. The oracle runs in a benchmark of its
own, after the others, so that a run stopped at its budget keeps what came before.

``adaptive@with-loaders`` runs adaptive with each job's training processes left in its CPU
group. On the H200, once the loaders had become cheaper, adaptive fell to 0.80x static in two
runs (1.10x before). On a GPU each job's training process works (pinning batches, launching
kernels, torch's intra-op threads); every policy moves it out of the job's group, where it
competes at a task's default weight beside groups that adaptive weights down to 40. The stage
tells whether that placement is the cost. Each run's controller log (every decision with its
reason) is kept beside the results.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench import node, report
from bench.mix import Mix, load_mix
from bench.runner import RunOutcome

WITH_LOADERS = "adaptive@with-loaders"
"""adaptive with each job's training processes in its CPU group (controller --training-processes)."""

STAGES = (("static", "even", "adaptive", WITH_LOADERS), ("oracle",))
"""The policies, in two benchmarks: the oracle's (its true curves measured first) last."""

ORACLE_AFTER = 1.5
"""The oracle's stage runs only with this many times the first stage's time left: it measures
every job's true curves (twice on a phase-changing mix) before its own runs. On the H200 it
never finished in what the first stage left (130 s of 300), and the part read as failed."""


def late_seconds(runs: list[RunOutcome]) -> dict[str, float]:
    """Per policy, the seconds its jobs' steps waited for their kernels past their compute time."""
    late: dict[str, float] = {}
    for run in runs:
        total = sum((job.timeline or {}).get("gpu_late_s", 0.0) for job in run.jobs)
        late[run.policy] = late.get(run.policy, 0.0) + total
    return late


def run(mix_path: Path, scale: float, cpus: str, compute: str, cache: Path,
        keep: Callable[[dict[str, Any]], None] = lambda result: None, workdir: Path | None = None,
        progress: Callable[[str], None] = print, logs: Path | None = None,
        time_left: Callable[[], float] | None = None, clock: Callable[[], float] = time.monotonic,
        stages: tuple[tuple[str, ...], ...] = STAGES) -> dict[str, Any]:
    """The benchmark in ``stages`` (:data:`STAGES`), one run per policy; ``keep`` gets the result
    so far after each stage, so that a run stopped in the oracle's stage keeps the others' figures. ``logs``:
    where each run's controller log is copied after its stage (``<run>.controller.log``).
    ``time_left``: seconds left of the part's budget (None: no limit); a later stage that would
    not fit (:data:`ORACLE_AFTER`) is not started, and the result says why (``not_run``)."""
    mix = load_mix(mix_path)
    if scale != 1.0:
        mix = mix.scaled(scale)
    setup = node.node_setup(mix, cpus, None, cache, compute=compute)
    documents: list[dict[str, Any]] = []
    late: dict[str, float] = {}
    first_stage_s: float | None = None
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="adloader-gpu-node-", dir=workdir) as directory:
        for stage in stages:
            left = None if first_stage_s is None or time_left is None else time_left()
            if left is not None and left < ORACLE_AFTER * first_stage_s:
                result["not_run"] = (f"{', '.join(stage)}: {left:.0f} s of the part's budget were left, "
                                     f"under {ORACLE_AFTER:g}x the {first_stage_s:.0f} s the first stage took")
                keep(result)
                progress(f"  not run: {result['not_run']}")
                break
            stage_started = clock()
            runs, document = node.benchmark(mix, stage, 1, setup, cache, Path(directory),
                                            progress=lambda policy, elapsed, jobs, snapshot: None)
            documents.append(document)
            if first_stage_s is None:
                first_stage_s = clock() - stage_started
            late.update(late_seconds(runs))
            result = _result(mix, scale, cpus, compute, documents, late)
            keep(result)
            if logs is not None:
                keep_controller_logs(Path(directory), logs)
    progress(f"  node benchmark ({mix.name} x{scale:g}, {compute}): adaptive/static "
             f"{_shown(result['adaptive_vs_static_gpu_busy'])}, /even {_shown(result['adaptive_vs_even_gpu_busy'])}, "
             f"/oracle {_shown(result['adaptive_vs_oracle_gpu_busy'])}, settle {result['settle_s']} s; "
             f"{WITH_LOADERS}/static {_shown(result['with_loaders_vs_static_gpu_busy'])}")
    return result


def keep_controller_logs(workdir: Path, logs: Path) -> list[Path]:
    """Copy every run's controller log under ``workdir`` to ``logs``, named by its run; the copies."""
    logs.mkdir(parents=True, exist_ok=True)
    kept = []
    for log in sorted(workdir.rglob("controller.log")):
        kept.append(Path(shutil.copyfile(log, logs / f"{log.parent.name}.controller.log")))
    return kept


def _result(mix: Mix, scale: float, cpus: str, compute: str, documents: list[dict[str, Any]],
            late: dict[str, float]) -> dict[str, Any]:
    policies = {label: summary for document in documents for label, summary in document["policies"].items()}
    every_ratio = report.ratios(policies)
    ratios = every_ratio.get("adaptive", {})
    return {
        "mix": mix.name, "scale": scale, "cpus": cpus, "jobs": len(mix.jobs), "gpu_step": documents[0]["benchmark"],
        "shared_gpu": "every job trains on the one GPU of this machine" if compute == "cuda" else None,
        "adaptive_vs_static_gpu_busy": ratios.get("vs_static", {}).get("gpu_busy"),
        "adaptive_vs_even_gpu_busy": ratios.get("vs_even", {}).get("gpu_busy"),
        "adaptive_vs_oracle_gpu_busy": ratios.get("vs_oracle", {}).get("gpu_busy"),
        "with_loaders_vs_static_gpu_busy": every_ratio.get(WITH_LOADERS, {}).get("vs_static", {}).get("gpu_busy"),
        "gpu_busy": {label: summary["gpu_busy"] for label, summary in policies.items()},
        "settle_s": policies.get("adaptive", {}).get("settle_s"),
        "gpu_late_s": late,
        "stages_done": len(documents),
        "documents": documents,
    }


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"
