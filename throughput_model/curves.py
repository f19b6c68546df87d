"""A job's loading curve, learnt online: samples/s its data loading delivers with c cores.

DESIGN.md's first-order model is T_load(c) = e(c)·c/p with a concave parallel
efficiency e(c). Rather than assume a shape for e, this module fits the most
general curve that model allows, a concave, non-decreasing, piecewise-linear
function through the origin, to what the job is seen doing: in each control
window the registry observes how many cores the job's cgroup really used and how
many samples it delivered. That pair is a point on the curve whether or not the
loader was the bottleneck (T samples/s cost u cores), so every window teaches
something and no user input is needed (MalleTrain's online job profiling).

The fit is an L1 concave regression, a small linear program solved by scipy's
HiGHS; medians per bin of cores keep start-up windows and scheduler noise from
bending the curve. A prior (p from the job's history or a probe) stands in until
the first observation arrives. Pure numpy/scipy: this package imports no other
package of ours.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Iterable, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

BEND_PENALTY = 0.05
"""Per observation, cost of the curve's slope falling by one (samples/s per core) times its
cores range, against the absolute error in samples/s; see _concave_l1_regression."""

MIN_BIN_SHARE = 0.1
"""See _bins: a bin needs this share of the observations (or three) to count."""

REFIT_STEP = 0.02
"""The curve is refitted when a bin's median samples/s moves by about this fraction."""

Point = tuple[float, float]
"""(cores, loading samples/s)."""
Line = tuple[float, float]
"""(intercept, slope): the curve is at most intercept + slope·cores."""


class LoadingCurveEstimator:
    """Online fit of one job's loading curve from (cores used, samples/s) windows.

    The registry calls :meth:`observe` once per control window and hands
    :meth:`points` to the policy as ``JobView.loading_curve``.
    """

    def __init__(
        self,
        prior_cpu_s_per_sample: float | None = None,
        max_observations: int = 64,
        resolution_cores: float = 0.05,
    ) -> None:
        """``prior_cpu_s_per_sample``: p to assume before the first observation (the curve
        is then c/p); ``max_observations``: the window kept, older ones are forgotten so a
        job whose cost changes is re-learnt; ``resolution_cores``: observations closer than
        this in cores are pooled (their median taken)."""
        if prior_cpu_s_per_sample is not None and not prior_cpu_s_per_sample > 0:
            raise ValueError(f"prior_cpu_s_per_sample must be positive, got {prior_cpu_s_per_sample}")
        if resolution_cores <= 0:
            raise ValueError(f"resolution_cores must be positive, got {resolution_cores}")
        self._prior = prior_cpu_s_per_sample
        self._resolution = resolution_cores
        self._observations: deque[Point] = deque(maxlen=max_observations)
        self._fit: tuple[Point, ...] = ()
        self._fit_key: tuple[Point, ...] | None = None

    def observe(self, cores_used: float, samples_per_s: float) -> None:
        """Record one window: the job used ``cores_used`` cores and delivered
        ``samples_per_s``. Windows with no CPU or non-finite values are ignored."""
        if not (math.isfinite(cores_used) and math.isfinite(samples_per_s)):
            return
        if cores_used <= 0 or samples_per_s < 0:
            return
        self._observations.append((float(cores_used), float(samples_per_s)))

    @property
    def observations(self) -> int:
        return len(self._observations)

    def points(self) -> tuple[Point, ...]:
        """The fitted curve as (cores, samples/s) knots, cores increasing, concave through
        the origin (the origin itself is implied, not listed). Empty when nothing is known."""
        if not self._observations:
            return ((1.0, 1.0 / self._prior),) if self._prior is not None else ()
        bins = _bins(self._observations, self._resolution)
        # Refit only when some bin's median moved by more than rounding: a job running
        # steadily costs the controller nothing per report.
        key = tuple((round(x, 2), round(math.log1p(y) / REFIT_STEP)) for x, y, _ in bins)
        if key != self._fit_key:
            self._fit_key = key
            self._fit = _fit_bins(bins)
        return self._fit


def fit_concave_curve(observations: Iterable[Point], resolution_cores: float = 0.05) -> tuple[Point, ...]:
    """L1 fit of a concave, non-decreasing, piecewise-linear curve through the origin.

    Observations are pooled in bins of ``resolution_cores`` (median cores and
    samples/s per bin, weighted by count); the curve's value at each bin's cores is
    chosen to minimise the weighted absolute error subject to concavity.
    """
    return _fit_bins(_bins(observations, resolution_cores))


def _bins(observations: Iterable[Point], resolution_cores: float) -> list[tuple[float, float, int]]:
    """(median cores, median samples/s, count) per bin of cores, cores increasing. Bins
    holding fewer than MIN_BIN_SHARE of the observations (and fewer than three) are
    transients, a job starting its workers or an allocation just changing, and are
    left out; when every bin is that small, all are kept."""
    pooled: dict[int, list[Point]] = {}
    for cores, sps in observations:
        pooled.setdefault(int(round(cores / resolution_cores)), []).append((cores, sps))
    total = sum(len(pts) for pts in pooled.values())
    kept = {k: pts for k, pts in pooled.items() if len(pts) >= min(3, MIN_BIN_SHARE * total)} or pooled
    return [
        (statistics.median(c for c, _ in pts), statistics.median(s for _, s in pts), len(pts))
        for _, pts in sorted(kept.items())
    ]


def _fit_bins(bins: list[tuple[float, float, int]]) -> tuple[Point, ...]:
    if not bins:
        return ()
    if len(bins) == 1:
        return ((bins[0][0], bins[0][1]),)
    xs = np.array([x for x, _, _ in bins])
    ys = np.array([y for _, y, _ in bins])
    weights = np.array([n for _, _, n in bins], dtype=float)
    values = _concave_l1_regression(xs, ys, weights)
    lines = concave_lines(list(zip(xs, values)))
    return _knots(lines, float(xs[-1]))


def _concave_l1_regression(xs: np.ndarray, ys: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """min Σ w_i |f_i − y_i| s.t. the slopes of (0,0),(x_1,f_1),…,(x_m,f_m) are ≥ 0 and
    non-increasing. Variables: f_1..f_m then e_1..e_m (the absolute errors)."""
    m = len(xs)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []
    row = 0

    def add(entries: list[tuple[int, float]], bound: float) -> None:
        nonlocal row
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)
        rhs.append(bound)
        row += 1

    for i in range(m):  # e_i >= |f_i - y_i|
        add([(i, 1.0), (m + i, -1.0)], ys[i])
        add([(i, -1.0), (m + i, -1.0)], -ys[i])
    # slope_k = (f_k - f_{k-1}) / (x_k - x_{k-1}), with f_0 = x_0 = 0.
    def slope_terms(k: int) -> list[tuple[int, float]]:
        width = xs[k] - (xs[k - 1] if k > 0 else 0.0)
        terms = [(k, 1.0 / width)]
        if k > 0:
            terms.append((k - 1, -1.0 / width))
        return terms

    for k in range(1, m):  # slope_k <= slope_{k-1}
        add(slope_terms(k) + [(c, -v) for c, v in slope_terms(k - 1)], 0.0)
    add([(c, -v) for c, v in slope_terms(m - 1)], 0.0)  # last slope >= 0: non-decreasing
    matrix = coo_matrix((vals, (rows, cols)), shape=(row, 2 * m)).tocsr()
    cost = np.concatenate([np.zeros(m), weights])
    # Bending costs: the slopes only ever fall, so their total fall is s_1 − s_m; charging
    # it keeps noise from putting a kink in a straight curve (and flattening the line the
    # policy extrapolates along) unless the data really saturates.
    bend = BEND_PENALTY * float(weights.sum()) * float(xs[-1])
    for col, val in slope_terms(0):
        cost[col] += bend * val
    for col, val in slope_terms(m - 1):
        cost[col] -= bend * val
    result = linprog(cost, A_ub=matrix, b_ub=np.array(rhs), bounds=[(0, None)] * (2 * m), method="highs")
    if result.status != 0:  # cannot happen for finite data: f = 0 is feasible and the cost is bounded
        raise RuntimeError(f"concave regression failed: {result.message}")
    return np.maximum(result.x[:m], 0.0)


def concave_lines(points: Sequence[Point]) -> tuple[Line, ...]:
    """Lines whose minimum is the least concave majorant through the origin of ``points``.

    For a concave curve through the origin this is the curve itself (the last line
    extends it beyond the last knot); arbitrary points are first hulled, so a policy
    handed noisy knots still gets a concave function. Empty input: no lines.
    """
    knots = sorted((float(c), float(s)) for c, s in points if c > 0 and math.isfinite(c) and math.isfinite(s))
    if not knots:
        return ()
    hull: list[Point] = [(0.0, 0.0)]
    for point in knots:
        if point[0] == hull[-1][0]:
            point = (point[0], max(point[1], hull[-1][1]))
            hull.pop()
        while len(hull) >= 2 and _not_concave(hull[-2], hull[-1], point):
            hull.pop()
        hull.append(point)
    lines: list[Line] = []
    for (x0, y0), (x1, y1) in zip(hull, hull[1:]):
        slope = (y1 - y0) / (x1 - x0)
        if slope <= 0:  # past the peak: more cores never make loading slower
            lines.append((y0, 0.0))
            break
        lines.append((y1 - slope * x1, slope))
    return tuple(lines)


def _knots(lines: Sequence[Line], last_cores: float) -> tuple[Point, ...]:
    """The knots of a concave curve given by its lines, up to ``last_cores``: where
    consecutive lines cross, then the curve's value at ``last_cores``."""
    knots: list[Point] = []
    for (a0, s0), (a1, s1) in zip(lines, lines[1:]):
        if s0 - s1 <= 1e-12 * max(abs(s0), 1.0):
            continue  # parallel up to rounding: no knot between them
        cores = (a1 - a0) / (s0 - s1)
        if (knots[-1][0] if knots else 0.0) < cores < last_cores:
            knots.append((cores, evaluate_lines(lines, cores)))
    knots.append((last_cores, evaluate_lines(lines, last_cores)))
    return tuple(knots)


def _not_concave(a: Point, b: Point, c: Point) -> bool:
    """True when b lies on or below the chord a–c, up to rounding (so b is not a hull vertex)."""
    left = (b[1] - a[1]) * (c[0] - a[0])
    right = (c[1] - a[1]) * (b[0] - a[0])
    return left <= right + 1e-9 * (abs(a[1]) + abs(b[1]) + abs(c[1])) * (c[0] - a[0])


def evaluate_lines(lines: Sequence[Line], cores: float) -> float:
    """The curve's value at ``cores``: the minimum of its lines (0 cores: 0; no lines: inf)."""
    if cores <= 0:
        return 0.0
    if not lines:
        return math.inf
    return max(0.0, min(a + s * cores for a, s in lines))
