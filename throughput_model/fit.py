"""Fit step time from features: a physical roofline per operator class, corrected by data.

The model, for a device with peak FLOP/s P, memory bandwidth BW and per-op cost tau::

    step = sum over classes c of  a_c * F_c/P  +  b_c * B_c/BW  +  o_c * n_c*tau

F_c, B_c, n_c are the class's FLOPs, bytes and op count (features). The coefficients are
dimensionless (1 = runs at the device's peak) and learned per operator class from the
per-class times the profiler measured, never per family, so a new architecture made of
known operator classes is predicted from what those classes cost elsewhere. Each class
is a non-negative least-squares fit (scikit-learn ``LinearRegression(positive=True)``)
weighted for relative error. A class the corpus barely shows borrows its coefficients
from its physical neighbours (an RNN's FLOPs cost what a GEMM's do, its bytes what an
element-wise op's do); with nothing to borrow it keeps the untuned roofline prior.

The prediction interval comes from leave-one-family-out residuals on the corpus
itself. The corpus is JSON data; the fitted model is rebuilt from it on first use
(milliseconds) and cached in the process.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
from sklearn.linear_model import LinearRegression

from throughput_model.counting import OP_CLASSES
from throughput_model.devices import Device, cpu_device
from throughput_model.errors import CorpusError

TERMS = ("flops", "bytes", "ops")

BORROW: dict[str, tuple[str, str, str]] = {
    "conv": ("gemm", "elementwise", "gemm"),
    "conv_grouped": ("conv", "elementwise", "conv"),
    "attention": ("gemm", "reduction", "gemm"),
    "rnn": ("gemm", "elementwise", "elementwise"),
    "embedding": ("gemm", "movement", "movement"),
}
"""Where a class with too little data takes its (flops, bytes, ops) coefficients from;
classes not listed borrow from ("gemm", "elementwise", "elementwise")."""

MIN_POINTS = 5
"""A class is fitted when at least this many corpus points spend ``MIN_SHARE`` of their step in it."""
MIN_SHARE = 0.03
INTERVAL_QUANTILES = (0.05, 0.95)


def load_corpus(path: Path | None = None) -> dict:
    """The corpus at ``path``, or the one shipped in ``throughput_model/data/corpus.json``."""
    try:
        if path is None:
            text = resources.files("throughput_model").joinpath("data/corpus.json").read_text()
        else:
            text = Path(path).read_text()
        corpus = json.loads(text)
    except (OSError, ValueError) as exc:
        where = path or "the shipped throughput_model/data/corpus.json"
        raise CorpusError(f"cannot read the corpus {where}: {exc}; "
                          "make one with 'adloader model profile --out FILE'") from None
    if not isinstance(corpus, dict) or not corpus.get("points"):
        raise CorpusError(f"corpus {path or 'shipped'} has no points; re-run 'adloader model profile'")
    return corpus


def corpus_device(corpus: Mapping) -> Device:
    """The device the corpus was measured on, with the numbers measured while profiling."""
    numbers = corpus["device_numbers"]
    return cpu_device(numbers, int(corpus.get("threads", 1)), str(corpus.get("cpu_model", "unknown cpu")))


# ---------------------------------------------------------------- the physical model


def class_terms(features: Mapping[str, float], device: Device) -> dict[str, np.ndarray]:
    """Per class, the three roofline terms in seconds at the device's peaks."""
    flops_rate = device.flops_for(features.get("dtype_bytes", 4.0))
    return {
        c: np.array([
            features.get(f"{c}_flops", 0.0) / flops_rate,
            features.get(f"{c}_bytes", 0.0) / device.memory_bandwidth,
            features.get(f"{c}_ops", 0.0) * device.op_overhead_s,
        ])
        for c in OP_CLASSES
    }


def roofline_seconds(features: Mapping[str, float], device: Device) -> float:
    """The analytic roofline from FLOPs and bytes alone: each class at the slower of its two peaks."""
    return float(sum(max(t[0], t[1]) for t in class_terms(features, device).values()))


def prior_seconds(features: Mapping[str, float], device: Device) -> float:
    """The untuned physical prior: the roofline plus the fixed cost of every op."""
    return float(sum(max(t[0], t[1]) + t[2] for t in class_terms(features, device).values()))


def allreduce_seconds(features: Mapping[str, float], gpus: int, device: Device) -> float:
    """Ring all-reduce of the gradients over ``gpus`` devices at the interconnect's bandwidth."""
    if gpus <= 1:
        return 0.0
    grad = features.get("grad_bytes", features.get("param_bytes", 0.0))
    return 2.0 * (gpus - 1) / gpus * grad / device.interconnect_bandwidth


# ---------------------------------------------------------------- the fitted model


@dataclass(frozen=True)
class FittedModel:
    """Per-class coefficients (dimensionless multipliers of the roofline terms) and the
    held-out log-residual quantiles that make the interval."""

    coefficients: dict[str, tuple[float, float, float]]
    sources: dict[str, str]
    """Per class: "fitted (N points)", "borrowed from ..." or "prior"."""
    device: Device
    points: int
    families: tuple[str, ...]
    log_interval: tuple[float, float]
    """Quantiles of log(measured / predicted) across held-out families."""

    def class_seconds(self, features: Mapping[str, float], device: Device | None = None) -> dict[str, float]:
        terms = class_terms(features, device or self.device)
        return {c: float(np.dot(self.coefficients[c], terms[c])) for c in OP_CLASSES}

    def step_seconds(self, features: Mapping[str, float], device: Device | None = None) -> float:
        return sum(self.class_seconds(features, device).values())

    def describe(self) -> str:
        lines = [f"per-class coefficients (1.0 = the device's peak; device: {self.device.source})",
                 f"{'class':<14}{'a FLOPs':>10}{'b bytes':>10}{'o ops':>10}  source"]
        for c in OP_CLASSES:
            a, b, o = self.coefficients[c]
            lines.append(f"{c:<14}{a:>10.3f}{b:>10.3f}{o:>10.3f}  {self.sources[c]}")
        low, high = self.log_interval
        lines.append(f"90% interval of measured/predicted step time (held-out families): "
                     f"{math.exp(low):.2f}x .. {math.exp(high):.2f}x")
        return "\n".join(lines)


def _design(points: list[dict], device: Device) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Per class, the term matrix (n x 3) and the measured seconds (n); plus the step times."""
    steps = np.array([p["step_s"] for p in points])
    terms = [class_terms(p["features"], device) for p in points]
    X = {c: np.array([t[c] for t in terms]) for c in OP_CLASSES}
    y = {c: np.zeros(len(points)) for c in OP_CLASSES}
    for i, p in enumerate(points):
        measured = p["class_s"]
        total = sum(measured.values())
        for c in OP_CLASSES:  # the instrumented split, scaled to the plain step's median
            y[c][i] = steps[i] * measured.get(c, 0.0) / total if total > 0 else 0.0
    return X, y, steps


def fit_coefficients(points: list[dict], device: Device) -> tuple[dict[str, tuple[float, float, float]], dict[str, str]]:
    """Fit every class that the points show enough of; borrow or keep the prior for the rest."""
    X, y, steps = _design(points, device)
    weights = 1.0 / np.maximum(steps, 1e-9) ** 2
    coefficients: dict[str, tuple[float, float, float]] = {}
    sources: dict[str, str] = {}
    for c in OP_CLASSES:
        shown = int(np.sum(y[c] >= MIN_SHARE * steps))
        if shown < MIN_POINTS:
            continue
        regression = LinearRegression(positive=True, fit_intercept=False)
        regression.fit(X[c], y[c], sample_weight=weights)
        coefficients[c] = tuple(float(v) for v in regression.coef_)  # type: ignore[assignment]
        sources[c] = f"fitted ({shown} points)"
    for c in OP_CLASSES:
        if c in coefficients:
            continue
        donors = BORROW.get(c, ("gemm", "elementwise", "elementwise"))
        borrowed = []
        for term, donor in enumerate(donors):
            fitted = coefficients.get(donor)
            borrowed.append(fitted[term] if fitted is not None else 1.0)
        coefficients[c] = tuple(borrowed)  # type: ignore[assignment]
        sources[c] = "borrowed from " + "/".join(d if d in sources and sources[d].startswith("fitted") else "prior"
                                                 for d in donors)
    return coefficients, sources


def fit(points: list[dict], device: Device, interval: tuple[float, float] | None = None) -> FittedModel:
    """Fit on ``points``; the interval is computed by leaving each family out in turn unless given."""
    if len(points) < MIN_POINTS:
        raise CorpusError(f"{len(points)} corpus points are too few to fit (need {MIN_POINTS}); profile more")
    coefficients, sources = fit_coefficients(points, device)
    families = tuple(dict.fromkeys(p["family"] for p in points))
    if interval is None:
        interval = held_out_interval(points, device)
    return FittedModel(coefficients, sources, device, len(points), families, interval)


def held_out_interval(points: list[dict], device: Device) -> tuple[float, float]:
    """Quantiles of log(measured/predicted) when each family is predicted by a fit without it."""
    residuals = leave_one_family_out_log_residuals(points, device)
    if len(residuals) < 2:
        return (math.log(0.5), math.log(2.0))
    low, high = np.quantile(residuals, INTERVAL_QUANTILES)
    return float(low), float(high)


def leave_one_family_out_log_residuals(points: list[dict], device: Device) -> np.ndarray:
    families = list(dict.fromkeys(p["family"] for p in points))
    residuals: list[float] = []
    if len(families) < 2:
        return np.array(residuals)
    for family in families:
        train = [p for p in points if p["family"] != family]
        test = [p for p in points if p["family"] == family]
        if len(train) < MIN_POINTS:
            continue
        model = fit(train, device, interval=(0.0, 0.0))
        residuals += [math.log(p["step_s"] / model.step_seconds(p["features"])) for p in test]
    return np.array(residuals)


def points_of(corpus: Mapping, families: Iterable[str] | None = None) -> list[dict]:
    wanted = set(families) if families is not None else None
    return [p for p in corpus["points"] if wanted is None or p["family"] in wanted]


@functools.lru_cache(maxsize=4)
def _fitted_cached(path: str | None, mtime: float) -> FittedModel:
    corpus = load_corpus(Path(path) if path else None)
    return fit(points_of(corpus), corpus_device(corpus))


def load_fitted(path: Path | None = None) -> FittedModel:
    """The model fitted on the corpus at ``path`` (default: the shipped corpus), cached per file version."""
    if path is None:
        return _fitted_cached(None, 0.0)
    try:
        mtime = Path(path).stat().st_mtime
    except OSError as exc:
        raise CorpusError(f"cannot read the corpus {path}: {exc}") from None
    return _fitted_cached(str(path), mtime)
