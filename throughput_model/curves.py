"""A job's loading curve, learnt online: samples/s its data loading delivers with c cores.

DESIGN.md's first-order model is T_load(c) = e(c)·c/p. In each control window the
registry observes how many cores the job's cgroup really used (u) and how many
samples it delivered (T). Whether or not the loader was the bottleneck, T/u is the
samples one core-second of the job's CPU buys, 1/p (a job waiting on its GPU uses
fewer cores for the same samples, not more per sample), so every window teaches
something and no user input is needed (MalleTrain's online job profiling).

The fit is deliberately robust rather than detailed: windows are pooled in bins of
cores, bins holding only a few windows (a job starting its workers, an allocation
just changing) are dropped, and the rate is the median over the rest, weighted by
window. The curve is the line through the origin at that rate, one concave piece:
on the small nodes measured here no parallel-efficiency loss e(c) < 1 stood out of
the noise, while every attempt to fit one from a handful of noisy bins bent the
curve flat somewhere, telling the policy that more cores do not help a starving
job. What a CPU *quota* costs on top (bursts throttled) is modelled by the policy
(controller/policies/shares.py, with_quota_knee). A prior (p from the job's history
or a probe) stands in until the first observation arrives.

A job changes phase (evaluation every N steps, a loading cost that doubles): its samples
per core-second move to a new level and stay there. A median over the last 64 windows
follows only once half of them are new, 30 s and more after the change. So the estimator
watches for a change point: when the last CHANGE_WINDOWS windows all measured a rate
more than CHANGE_RATIO away from the fit over the windows before them, all on the same
side, those earlier windows describe a job that no longer exists and are dropped. Noise
rarely does that: a window's rate is off by ±20% on a busy node, and a run of windows all
beyond 1.5x on one side is what a phase does (``phase_changes`` counts them).

Pure numpy/scipy and the standard library: this package imports no other package of ours.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Iterable, Sequence

WARMUP_OBSERVATIONS = 2
"""The first windows of a job are dropped: its workers start, its cgroup pays for imports."""
MIN_OBSERVATIONS = 3
"""Windows kept before the fit is trusted (until then: the prior, or nothing). With 4 a
newcomer's first plan came 5.6 s after its first report (seeded random mix 19: a settle
past the 5 s goal); with 3 about a second earlier. Two identical jobs in the simulator were
planned unevenly on 2 of 40 seeds with 3, 1 of 40 with 4 (and 5 of 40 with a one-window
warm-up instead)."""

CHANGE_WINDOWS = 16
"""Consecutive windows that must all disagree with the curve before it is dropped (see above).
The registry's windows overlap (five seconds, one per one-second period): 16 of them are
about three independent ones, so a doubled loading cost is followed about 20 s after it
happens instead of 35 s and more. With 8, jobs counting one or two whole batches per window
were seen to 'change phase' by chance in the simulator (45 times in 12 mixes; 3 with 16)."""
CHANGE_RATIO = 1.5
"""How far (either way, as a factor of samples per core-second) a window must lie from the
curve to count as disagreeing. Twice and half the cost are found once most of a window holds
the new phase; the ±20% of a window's noise on a busy node never reach it."""

MIN_BIN_SHARE = 0.1
"""See _bins: a bin needs this share of the observations (or three) to count."""

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
        self._batches: deque[float | None] = deque(maxlen=max_observations)
        """New batches the job delivered in each kept window's step (None: not counted)."""
        self._seen = 0
        self._fitted: tuple[Point, ...] | None = None
        """points() since the last window: every status read and control step asks for it."""
        self.phase_changes = 0
        """Change points found so far (each dropped the windows before it)."""

    def observe(self, cores_used: float, samples_per_s: float, new_batches: float | None = None) -> None:
        """Record one window: the job used ``cores_used`` cores and delivered
        ``samples_per_s``, ``new_batches`` of them since the previous window (the evidence
        the curve gains; None: not counted). Windows with no CPU or non-finite values are
        ignored."""
        if not (math.isfinite(cores_used) and math.isfinite(samples_per_s)):
            return
        if cores_used <= 0 or samples_per_s < 0:
            return
        self._seen += 1
        if self._seen > WARMUP_OBSERVATIONS:
            self._fitted = None
            self._observations.append((float(cores_used), float(samples_per_s)))
            self._batches.append(new_batches)
            if changed_phase(self._observations, self._resolution):
                _keep_last(self._observations, CHANGE_WINDOWS)
                _keep_last(self._batches, CHANGE_WINDOWS)
                self.phase_changes += 1

    @property
    def observations(self) -> int:
        return len(self._observations)

    @property
    def evidence_batches(self) -> float | None:
        """Batches delivered over the steps of the kept windows: what the curve's rate was
        counted from (whole batches, so its relative noise is about 1/sqrt of this). None
        before the curve rests on its windows (a prior, or nothing) and when some window was
        not counted (resumed from a checkpoint): no doubt is assumed then."""
        if len(self._batches) < MIN_OBSERVATIONS or any(b is None for b in self._batches):
            return None
        return float(sum(b for b in self._batches if b is not None))

    def observed(self) -> tuple[Point, ...]:
        """The windows kept (warm-up excluded), oldest first: what a checkpoint saves."""
        return tuple(self._observations)

    def resume(self, observed: Iterable[Point]) -> None:
        """Take back windows :meth:`observed` returned before a restart: the job is past its
        warm-up, and :meth:`points` is what it was."""
        self._fitted = None
        for cores, sps in observed:
            self._observations.append((float(cores), float(sps)))
            self._batches.append(None)
            self._seen = max(self._seen, WARMUP_OBSERVATIONS) + 1

    def restart(self) -> None:
        """Forget every window kept: they measured a group that held more than the job's loading
        (its training process, until the controller moved it out: its imports and start-up cost
        1-2 s of CPU and made a first curve twice too dear). The prior stays; the warm-up is
        over, since the loaders were already running, so the next window counts."""
        self._fitted = None
        self._observations.clear()
        self._batches.clear()
        self._seen = max(self._seen, WARMUP_OBSERVATIONS)

    def cpu_s_per_sample(self) -> float | None:
        """CPU seconds one sample costs by the fitted curve (its first knot); None when nothing
        is known."""
        knots = self.points()
        return knots[0][0] / knots[0][1] if knots and knots[0][1] > 0 else None

    def points(self) -> tuple[Point, ...]:
        """The fitted curve as (cores, samples/s) knots, cores increasing; the origin is
        implied, and the curve goes on beyond the last knot along its last piece. Empty
        when nothing is known (fewer than MIN_OBSERVATIONS windows after the warm-up, and
        no prior)."""
        if len(self._observations) < MIN_OBSERVATIONS:
            return ((1.0, 1.0 / self._prior),) if self._prior is not None else ()
        if self._fitted is None:
            self._fitted = fit_loading_curve(self._observations, self._resolution)
        return self._fitted


def _keep_last(kept: deque, n: int) -> None:
    """Drop all but the last ``n`` items of ``kept``."""
    while len(kept) > n:
        kept.popleft()


def fit_loading_curve(observations: Iterable[Point], resolution_cores: float = 0.05) -> tuple[Point, ...]:
    """One knot (median cores used, those cores times the median samples per core-second)
    over the windows that are not transients; the curve is the line from the origin."""
    kept = [point for _, points in _bins(observations, resolution_cores) for point in points]
    if not kept:
        return ()
    cores = statistics.median(c for c, _ in kept)
    rate = statistics.median(s / c for c, s in kept)
    return ((cores, cores * rate),)


def changed_phase(observations: Sequence[Point], resolution_cores: float = 0.05) -> bool:
    """True when the last CHANGE_WINDOWS of ``observations`` all lie more than CHANGE_RATIO
    from the curve fitted to the windows before them (at least as many), on the same side:
    a change point. A window that delivered nothing is no evidence of a new phase."""
    if len(observations) < 2 * CHANGE_WINDOWS:
        return False
    points = list(observations)
    earlier = fit_loading_curve(points[:-CHANGE_WINDOWS], resolution_cores)
    if not earlier or earlier[0][1] <= 0:
        return False
    rate = earlier[0][1] / earlier[0][0]
    ratios = [s / (c * rate) for c, s in points[-CHANGE_WINDOWS:]]
    if any(r <= 0 for r in ratios):
        return False
    return all(r > CHANGE_RATIO for r in ratios) or all(r < 1.0 / CHANGE_RATIO for r in ratios)


def _bins(observations: Iterable[Point], resolution_cores: float) -> list[tuple[int, list[Point]]]:
    """The observations pooled by cores, bins in increasing order. Bins holding fewer than
    MIN_BIN_SHARE of the observations (and fewer than three) are transients and are left
    out; when every bin is that small, all are kept."""
    pooled: dict[int, list[Point]] = {}
    for cores, sps in observations:
        pooled.setdefault(int(round(cores / resolution_cores)), []).append((cores, sps))
    total = sum(len(pts) for pts in pooled.values())
    kept = {k: pts for k, pts in pooled.items() if len(pts) >= min(3, MIN_BIN_SHARE * total)} or pooled
    return sorted(kept.items())


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
