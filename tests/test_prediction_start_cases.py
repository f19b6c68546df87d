"""The prediction-start benchmark's wrong-prediction cases: the mix that makes the unchanged
prediction 30 % off in either direction, and the idle after the first window (the take-over)."""
from __future__ import annotations

import pytest

from bench.mix import PREDICTION_MIX, load_mix
from bench.model_jobs import corpus_point
from bench.prediction_start import PREDICTION_ERRORS, off_mix, window_idle
from throughput_model.predict import predict

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("error", PREDICTION_ERRORS)
def test_the_wrong_mix_puts_the_unchanged_prediction_that_far_off_the_true_m(error: float) -> None:
    mix = load_mix(PREDICTION_MIX)
    wrong = off_mix(mix, error)
    assert [j.name for j in wrong.jobs] == [j.name for j in mix.jobs] and wrong.name != mix.name
    for right, off in zip(mix.jobs, wrong.jobs):
        assert off.model == right.model
        if right.model is None:
            assert off == right
            continue
        # the features the job sends come from its model, not its step: the prediction does not move
        predicted = predict(corpus_point(right)["features"], device="cpu").samples_per_s
        assert predicted / off.max_throughput == pytest.approx((1 + error) * predicted / right.max_throughput)
    assert {f"{e:+.0%}" for e in PREDICTION_ERRORS} == {"-30%", "+30%"}


def test_idle_after_the_window_counts_only_what_follows_it() -> None:
    # Steps of 5 s at 0, 10, 20, 30, 40 s; the loop ends at 50 s.
    timeline = {"loop_s": 50.0, "steps": [[t, 0.0, 5.0] for t in (0.0, 10.0, 20.0, 30.0, 40.0)]}
    assert window_idle(timeline, 30.0) == pytest.approx(0.5)  # 10 s busy of 20
    assert window_idle(timeline, 32.0) == pytest.approx(1 - 8 / 18)  # a step straddling the start counts from it
    assert window_idle(timeline, 0.0, 30.0) == pytest.approx(0.5)
    assert window_idle({"loop_s": 20.0, "steps": [[0.0, 0.0, 5.0]]}, 30.0) is None  # ended inside the window
