"""The jobs' true curves, measured separately, for the ``oracle`` policy.

Each job of the mix runs alone on the benchmark's node (a controller under the
``static`` policy: nothing limited) with two workers, its emulated GPU far quicker
than its loading, for a few seconds: its CPU time over the training loop (main
process and workers) divided by its samples is p, the CPU seconds one sample
really costs, overheads included. Its loading curve is then T_load(c) = c/p, M is
its batch over its emulated compute time, and b the bytes it reads from the
device per sample (the raw sample size for a job bound by reads, 0 for JPEGs
served by the page cache). Results are cached per job shape under the cache directory.

A job that changes phase is probed in its first phase, or, for the curves of the mix's last
phases (``last_phase``), in its last one: its probe starts there. The best static split of
a phase-changing mix is the better of the splits best for each (bench/node.py), as in the
simulator (bench/simulate.py's ``oracle``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from bench.mix import JobSpec, Mix
from bench.runner import NodeSetup, run_policy

log = logging.getLogger(__name__)

PROBE_SECONDS = 4.0
PROBE_WORKERS = 2


def true_curves(mix: Mix, datasets: dict[str, Path], cache_dir: Path, node: NodeSetup, workdir: Path,
                last_phase: bool = False) -> dict[str, dict]:
    """{job name: {"max_throughput", "loading_curve", "bytes_per_sample", "cpu_s_per_sample"}}
    in the format controller/policies/oracle.py reads; of each job's last phase where
    ``last_phase`` (else its first)."""
    cache_file = cache_dir / "true-cpu-per-sample.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    curves = {}
    for spec in mix.jobs:
        key = f"px{spec.image_px}-b{spec.batch_size}-{'raw' if spec.io_bound else 'jpeg'}"
        if spec.changes_phase:  # probed in one phase throughout, however soon it would change
            cost = spec.phase_cost if last_phase else spec.first_phase_cost
            spec = replace(spec, phase_after_s=0.0, phase_cost=cost, first_phase_cost=cost)
            key += f"-phase{cost}" if cost > 1 else ""
        if key not in cache:
            log.info("calibrating %s (%s) alone for about %.0fs", spec.name, key, PROBE_SECONDS)
            cache[key] = probe_cpu_per_sample(spec, datasets[spec.name], node, workdir)
            cache_dir.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps(cache, indent=1) + "\n")
        p = cache[key]
        curves[spec.name] = {
            "max_throughput": spec.max_throughput,
            "loading_curve": [[1.0, 1.0 / p]],
            "bytes_per_sample": float(spec.raw_sample_bytes) if spec.io_bound else 0.0,
            "cpu_s_per_sample": p,
        }
    return curves


def probe_cpu_per_sample(spec: JobSpec, dataset: Path, node: NodeSetup, workdir: Path) -> float:
    """CPU seconds per sample of ``spec`` run alone: loop CPU time / samples."""
    samples = max(4 * spec.batch_size, int(PROBE_SECONDS * _rough_rate(spec)))
    probe = replace(spec, name=f"probe-{spec.name}", compute_ms_per_batch=0.1, samples=samples, eval_every_steps=None,
                    arrival_s=0.0, num_workers=PROBE_WORKERS)
    run = run_policy(Mix(jobs=(probe,), name="calibration"), "static", {probe.name: dataset},
                     workdir / "calibration", node)
    timeline = run.jobs[0].timeline or {}
    return float(timeline["cpu_s"]) / float(timeline["samples"])


def _rough_rate(spec: JobSpec) -> float:
    """Samples/s a two-core loader reaches, roughly, to size the probe (not a measurement)."""
    if spec.io_bound:
        return 400.0
    return 2.0 / (0.3e-3 + 27e-9 * spec.image_px * spec.image_px)


def write_curves(path: Path, curves: dict[str, dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": curves}, indent=1) + "\n")
    return path
