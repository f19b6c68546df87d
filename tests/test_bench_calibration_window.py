"""bench.calibration_window: the spread statistic, and a short run of both ways interleaved."""
from __future__ import annotations

import math

import pytest

from bench.calibration_window import WAYS, main, run, spread

pytestmark = pytest.mark.pure


def _row(round_: int, model_type: str, log_error: float, way: str = "window") -> dict:
    return {"round": round_, "model_type": model_type, "way": way, "step_s": math.exp(log_error), "predicted_step_s": 1.0}


def test_a_factor_common_to_a_round_and_one_owned_by_an_architecture_are_no_spread() -> None:
    rows = [_row(k, a, own + drift) for k, drift in enumerate((0.0, 0.3, -0.2)) for a, own in (("a", 0.1), ("b", -0.4), ("c", 0.0))]
    result = spread(rows, "window")
    assert result["median_deviation"] == pytest.approx(0, abs=1e-12) and result["p90_deviation"] == pytest.approx(0, abs=1e-12)
    assert result["n"] == 3 and result["rounds"] == 3 and result["median_ape"] > 0


def test_an_architecture_whose_error_moves_between_rounds_is_spread() -> None:
    rows = [_row(k, a, 0.0) for k in range(2) for a in ("a", "b", "c")]
    rows += [_row(0, "d", 0.2), _row(1, "d", -0.2), _row(0, "a", 5.0, way="pair")]
    result = spread(rows, "window")
    assert result["p90_deviation"] > 0.1 and result["median_deviation"] == pytest.approx(0, abs=1e-12)
    assert spread(rows, "pair")["n"] == 1  # each way on its own rows


def test_an_unknown_family_is_one_plain_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--families", "vision,sculpture"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("unknown family in --families: ['sculpture']") and "\n" not in said


@pytest.mark.slow
def test_a_short_run_times_both_ways_interleaved() -> None:
    pytest.importorskip("transformers", reason="the public set is built with Hugging Face transformers, an optional "
                                               "dependency (docs/prediction.md)")
    said: list[str] = []
    result = run(per_family=1, rounds=2, steps=2, warmup=1, corpus=None, families=("vision", "text-classifier"),
                 progress=said.append)
    rows = result["rows"]
    architectures = {r["model_type"] for r in rows}
    assert {r["family"] for r in rows} == {"vision", "text-classifier"} and len(architectures) == 2
    first_round = [r["way"] for r in rows if r["round"] == 0]
    second_round = [r["way"] for r in rows if r["round"] == 1]
    assert first_round[:2] == list(WAYS) and second_round[:2] == list(WAYS[::-1])
    for row in rows:
        assert len(row["calibrations"]) == (2 if row["way"] == "pair" else 3)  # 2 timed steps: before each, after the last
        assert row["step_s"] > 0 and row["predicted_step_s"] > 0
    assert set(result["summary"]) == set(WAYS) and all(s["n"] == 2 for s in result["summary"].values())
    assert len(said) == 1 + len(rows)
