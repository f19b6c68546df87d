"""The node benchmark with real training: the mix's jobs train zoo models on the device.

The same benchmark as ``adloader bench`` (bench/node.py: a real controller per policy, real
jobs through ``adloader run`` over real JPEG loading), its jobs' GPU steps made by
bench/gpu_step.py: on a GPU every job trains a small zoo model on it, all of them sharing the
one device, each step held to the mix's compute time; the jobs' ``gpu_late_s`` says whether
the GPU ever was the limit. Reported: adaptive against static, even and the oracle (GPU busy),
each policy's GPU busy, and adaptive's settling time.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench import node
from bench.mix import load_mix
from bench.runner import RunOutcome

POLICIES = ("static", "even", "adaptive", "oracle")


def late_seconds(runs: list[RunOutcome]) -> dict[str, float]:
    """Per policy, the seconds its jobs' steps waited for their kernels past their compute time."""
    late: dict[str, float] = {}
    for run in runs:
        total = sum((job.timeline or {}).get("gpu_late_s", 0.0) for job in run.jobs)
        late[run.policy] = late.get(run.policy, 0.0) + total
    return late


def run(mix_path: Path, scale: float, cpus: str, compute: str, cache: Path, workdir: Path | None = None,
        progress=print) -> dict[str, Any]:
    mix = load_mix(mix_path)
    if scale != 1.0:
        mix = mix.scaled(scale)
    setup = node.node_setup(mix, cpus, None, cache, compute=compute)
    with tempfile.TemporaryDirectory(prefix="adloader-gpu-node-", dir=workdir) as directory:
        runs, document = node.benchmark(mix, POLICIES, 1, setup, cache, Path(directory),
                                        progress=lambda policy, elapsed, jobs, snapshot: None)
    policies = document["policies"]
    ratios = document["ratios"].get("adaptive", {})
    result = {
        "mix": mix.name, "scale": scale, "cpus": cpus, "jobs": len(mix.jobs), "gpu_step": document["benchmark"],
        "shared_gpu": "every job trains on the one GPU of this machine" if compute == "cuda" else None,
        "adaptive_vs_static_gpu_busy": ratios.get("vs_static", {}).get("gpu_busy"),
        "adaptive_vs_even_gpu_busy": ratios.get("vs_even", {}).get("gpu_busy"),
        "adaptive_vs_oracle_gpu_busy": ratios.get("vs_oracle", {}).get("gpu_busy"),
        "gpu_busy": {label: summary["gpu_busy"] for label, summary in policies.items()},
        "settle_s": policies.get("adaptive", {}).get("settle_s"),
        "gpu_late_s": late_seconds(runs),
        "goals": document["goals"],
        "document": document,
    }
    progress(f"  node benchmark ({mix.name} x{scale:g}, {compute}): adaptive/static "
             f"{_shown(result['adaptive_vs_static_gpu_busy'])}, /even {_shown(result['adaptive_vs_even_gpu_busy'])}, "
             f"/oracle {_shown(result['adaptive_vs_oracle_gpu_busy'])}, settle {result['settle_s']} s")
    return result


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"
