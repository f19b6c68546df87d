"""bench.gil_step runs torch's loader and adloader's under a GIL-holding step, each in a fresh
interpreter, and reports the step time of both and their ratio."""
from __future__ import annotations

from bench.gil_step import run, step_ms


def test_a_short_run_times_both_loaders_interleaved_and_gives_their_ratio() -> None:
    said: list[str] = []
    result = run(repeats=2, batches=20, spin_ms=2.0, workers=1, progress=said.append)
    assert [row["order"] for row in result["runs"]] == [["torch", "adloader"], ["adloader", "torch"]]
    for row in result["runs"]:
        assert row["torch_step_ms"] >= 2.0 and row["adloader_step_ms"] >= 2.0  # the spin is in every step
        assert row["ratio"] == row["adloader_step_ms"] / row["torch_step_ms"]
    assert 0.5 < result["median_ratio_adloader_over_torch"] < 2.0 and len(said) == 2


def test_a_step_takes_at_least_its_spin_over_either_loader() -> None:
    assert step_ms("adloader", batches=10, spin_ms=3.0, workers=1) >= 3.0
    assert step_ms("torch", batches=10, spin_ms=3.0, workers=1) >= 3.0
