"""bench/trainer_stall.py: the trainer-stall benchmark runs its cells in real cgroup v1 groups
and leaves none behind; its summary reads the overruns it was given."""
from __future__ import annotations

import pytest

from bench.trainer_stall import Cell, measure, summary
from controller.backends.cgroup_v1 import CgroupV1Backend
from fixtures.cgroup_v1 import ROOT, needs_v1, remove_group, unique_group


def test_summary_reads_the_overruns() -> None:
    overruns = [0.001 * i for i in range(1, 21)]  # 1..20 ms
    row = summary(overruns, step_s=0.04)
    assert row["steps"] == 20
    assert row["mean_overrun_ms"] == pytest.approx(10.5)
    assert row["median_overrun_ms"] == pytest.approx(10.5)
    assert row["p95_overrun_ms"] == pytest.approx(20.0)
    assert row["step_stretch"] == pytest.approx(1 + 0.0105 / 0.04)


@needs_v1
@pytest.mark.parametrize("cell", [Cell(36), Cell(36, trainer_apart=True)], ids=lambda c: c.label)
def test_a_cell_runs_in_real_groups_and_removes_them(cell: Cell) -> None:
    group = unique_group()
    backend = CgroupV1Backend(group=group, root=ROOT)
    try:
        overruns = measure(backend, cell, workers=1, step_s=0.02, duration_s=0.3)
        assert overruns and all(value > -0.005 for value in overruns)  # a sleep never returns early
        group_dir = ROOT / "cpu" / group
        assert not group_dir.exists() or not [d for d in group_dir.iterdir() if d.is_dir()]  # the cell's groups are gone
    finally:
        backend.remove_group()
        remove_group(group)
