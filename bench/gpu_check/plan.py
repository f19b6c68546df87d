"""The parts of the GPU check, their sizes and time budgets, on a GPU and in a dry run.

The whole check must fit 8 minutes of a lent GPU machine (1 GPU, 16 cores). Each part gets a
budget; it is sized to end well within it, and it is stopped at it (``PartTimeout``) if it
does not, so that one part never costs the others their turn. The dry run (``--dry-run``,
CPU, the emulated device) takes the smallest sizes that still run every path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from adloader.cpuspec import format_cpus
from bench.mix import MIXES_DIR

TOTAL_BUDGET_S = 8 * 60


@dataclass(frozen=True)
class Sizes:
    data_wait_steps: int
    overhead_batches: int
    overhead_repeats: int
    resize_samples: int
    model_budget_s: float
    model_points: tuple[tuple[str, int], ...] | None
    """(zoo model, batch) to profile; None: the whole zoo, as far as the budget goes."""
    model_steps: int
    node_mix: Path
    node_scale: float
    node_cpus: str
    node_compute: str


GPU = Sizes(
    data_wait_steps=40, overhead_batches=300, overhead_repeats=5, resize_samples=640, model_budget_s=90.0,
    model_points=None, model_steps=10, node_mix=MIXES_DIR / "real_node_16.json", node_scale=0.25,
    node_cpus=format_cpus(sorted(os.sched_getaffinity(0))), node_compute="cuda",
)
DRY_RUN = Sizes(
    data_wait_steps=12, overhead_batches=10, overhead_repeats=2, resize_samples=80, model_budget_s=20.0,
    model_points=(("mlp-w256-d2", 16), ("mlp-w2048-d2", 8), ("resnet-basic-w16-1x1x1-g1-i32", 4),
                  ("resnet-bneck-w24-2x2x2-g4-i32", 2), ("vit-i32-p4-d128-l2-h4", 4), ("vit-i64-p8-d256-l4-h8", 1)),
    model_steps=4, node_mix=MIXES_DIR / "gpu_check_tiny.json", node_scale=1.0, node_cpus="0-1", node_compute="sleep",
)

BUDGETS_S = {"data_wait": 45.0, "overhead": 60.0, "resize": 30.0, "throughput_model": 110.0, "node": 300.0}
"""Seconds each part may take on the GPU machine (the throughput model profiles for its
``model_budget_s`` and then fits). :data:`TOTAL_BUDGET_S` caps each part at the time left, so
the node benchmark, last, gets what the others left (about 250 s): its scale is sized for that,
and its oracle runs last, after the other policies' figures are kept."""
