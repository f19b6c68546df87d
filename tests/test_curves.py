"""The online loading curve: recovers known curves from noisy windows, stays concave."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughput_model.curves import (
    MIN_OBSERVATIONS,
    WARMUP_OBSERVATIONS,
    LoadingCurveEstimator,
    concave_lines,
    evaluate_lines,
    fit_loading_curve,
)


def _curve_at(points: tuple[tuple[float, float], ...], cores: float) -> float:
    return evaluate_lines(concave_lines(points), cores)


def test_nothing_known_gives_no_curve_and_a_prior_gives_c_over_p() -> None:
    assert LoadingCurveEstimator().points() == ()
    prior = LoadingCurveEstimator(prior_cpu_s_per_sample=0.004)
    assert _curve_at(prior.points(), 0.5) == pytest.approx(125.0)
    prior.observe(1.0, 50.0)  # warm-up windows (a job starting) are not believed
    for _ in range(WARMUP_OBSERVATIONS - 1):
        prior.observe(1.0, 50.0)
    for _ in range(MIN_OBSERVATIONS - 1):
        prior.observe(1.0, 400.0)
    assert _curve_at(prior.points(), 0.5) == pytest.approx(125.0)  # not enough windows yet: the prior
    prior.observe(1.0, 400.0)
    assert _curve_at(prior.points(), 0.5) == pytest.approx(200.0)  # then the measurements take over


def test_linear_loading_is_recovered_from_noisy_windows_and_extrapolated() -> None:
    rng = random.Random(7)
    estimator = LoadingCurveEstimator()
    for _ in range(40):
        cores = rng.uniform(0.2, 0.8)
        estimator.observe(cores, 250.0 * cores * rng.uniform(0.95, 1.05))
    for cores in (0.3, 0.6, 1.5):
        assert _curve_at(estimator.points(), cores) == pytest.approx(250.0 * cores, rel=0.06)


def test_start_up_windows_do_not_count_once_the_job_runs_steadily() -> None:
    estimator = LoadingCurveEstimator()
    estimator.observe(1.6, 20.0)  # workers starting: much CPU, few samples
    estimator.observe(1.2, 60.0)
    for _ in range(20):
        estimator.observe(0.5, 200.0)
    assert _curve_at(estimator.points(), 1.0) == pytest.approx(400.0)


def test_a_restart_forgets_the_windows_keeps_the_prior_and_counts_the_next_window() -> None:
    estimator = LoadingCurveEstimator(prior_cpu_s_per_sample=0.004)
    for _ in range(WARMUP_OBSERVATIONS + MIN_OBSERVATIONS):
        estimator.observe(2.0, 100.0)  # a group that also held the training process's start-up
    assert estimator.cpu_s_per_sample() == pytest.approx(0.02)
    estimator.restart()
    assert estimator.observations == 0 and estimator.cpu_s_per_sample() == pytest.approx(0.004)  # the prior
    for _ in range(MIN_OBSERVATIONS):
        estimator.observe(0.5, 100.0)  # the loaders alone
    assert estimator.observations == MIN_OBSERVATIONS and estimator.cpu_s_per_sample() == pytest.approx(0.005)


def test_a_single_outlier_window_does_not_bend_the_curve() -> None:
    estimator = LoadingCurveEstimator()
    for _ in range(9):
        estimator.observe(0.5, 100.0)
    estimator.observe(0.5, 5.0)  # workers starting up
    assert _curve_at(estimator.points(), 0.5) == pytest.approx(100.0)


def test_invalid_windows_are_ignored() -> None:
    estimator = LoadingCurveEstimator()
    for cores, sps in [(0.0, 10.0), (-1.0, 10.0), (0.5, -3.0), (math.nan, 1.0), (1.0, math.inf)]:
        estimator.observe(cores, sps)
    assert estimator.observations == 0 and estimator.points() == ()


def test_old_windows_are_forgotten_so_a_changed_job_is_relearnt() -> None:
    estimator = LoadingCurveEstimator(max_observations=8)
    for _ in range(8):
        estimator.observe(1.0, 100.0)
    for _ in range(8):
        estimator.observe(1.0, 400.0)
    assert _curve_at(estimator.points(), 1.0) == pytest.approx(400.0)


def test_concave_lines_hull_noisy_knots_and_flatten_past_the_peak() -> None:
    lines = concave_lines([(1.0, 100.0), (0.5, 40.0), (2.0, 150.0), (3.0, 120.0)])
    assert evaluate_lines(lines, 0.5) == pytest.approx(50.0)  # (0.5, 40) lies under the chord: hulled
    assert evaluate_lines(lines, 3.0) == pytest.approx(150.0)  # never decreasing
    assert evaluate_lines(lines, 0.0) == 0.0
    assert evaluate_lines((), 1.0) == math.inf


observations = st.lists(
    st.tuples(st.floats(0.01, 8.0), st.floats(0.0, 1e5)), min_size=1, max_size=80
)


@settings(max_examples=150, deadline=None)
@given(observations)
def test_the_fit_is_a_line_through_the_origin_at_a_rate_some_window_saw(points: list[tuple[float, float]]) -> None:
    knots = fit_loading_curve(points)
    assert len(knots) == 1
    cores, sps = knots[0]
    rates = [s / c for c, s in points]
    assert min(c for c, _ in points) <= cores <= max(c for c, _ in points)
    assert min(rates) - 1e-9 <= sps / cores <= max(rates) + 1e-9


@settings(max_examples=150, deadline=None)
@given(observations)
def test_the_lines_a_policy_gets_are_concave_non_decreasing_and_through_the_origin(
    points: list[tuple[float, float]],
) -> None:
    lines = concave_lines(points)
    values = [evaluate_lines(lines, c / 10) for c in range(0, 100)]
    assert values[0] == 0.0
    assert all(b >= a - 1e-6 * max(1.0, a) for a, b in zip(values, values[1:]))
    assert all(b - a >= c - b - 1e-6 * max(1.0, c) for a, b, c in zip(values, values[1:], values[2:]))


@settings(max_examples=100, deadline=None)
@given(observations, observations)
def test_the_curve_asked_for_between_windows_is_the_fit_of_the_windows_so_far(
    first: list[tuple[float, float]], then: list[tuple[float, float]]
) -> None:
    """points() is kept between windows (every step and status read asks for it): it must be
    what a fresh fit of the windows kept gives, whenever it is asked."""
    estimator = LoadingCurveEstimator()
    for cores, sps in first + then:
        estimator.observe(cores, sps)
        expected = fit_loading_curve(estimator.observed()) if estimator.observations >= MIN_OBSERVATIONS else ()
        assert estimator.points() == expected
    restarted = LoadingCurveEstimator()
    restarted.resume(estimator.observed())
    assert restarted.points() == estimator.points()


def test_the_evidence_is_the_batches_of_the_kept_windows_and_unknown_once_resumed() -> None:
    estimator = LoadingCurveEstimator()
    for _ in range(WARMUP_OBSERVATIONS + MIN_OBSERVATIONS - 1):
        estimator.observe(1.0, 100.0, 5)
    assert estimator.evidence_batches is None  # the curve does not rest on its windows yet
    estimator.observe(1.0, 100.0, 5)
    assert estimator.evidence_batches == 5 * MIN_OBSERVATIONS  # warm-up windows count for nothing
    resumed = LoadingCurveEstimator()
    resumed.resume(estimator.observed())
    resumed.observe(1.0, 100.0, 5)
    assert resumed.evidence_batches is None
