"""Fit step time from features: a physical roofline per operator class, corrected by data.

The model, for a device with peak FLOP/s P, memory bandwidth BW and per-op cost tau::

    step = sum over classes c of   r_c * max(F_c/P, B_c/BW)     the roofline
                                 + v_c * min(F_c/P, B_c/BW)     what compute and memory fail to overlap
                                 + o_c * n_c * tau              fixed cost per op
                                 + m_c * A_c/BW                 fresh large buffers (page faults)
                                 + l_c * L_c/BW                 im2col buffers of GEMM-lowered ops

F_c, B_c, n_c are the class's FLOPs, bytes and op count, A_c the bytes of the large buffers its
ops allocate, L_c the column-buffer traffic of ops the CPU runs GEMM-lowered (a wide depthwise
convolution; features). The untuned prior is r = o = l = 1, v = m = 0. The coefficients are
dimensionless (1 = runs at the device's peak) and learned per operator class from the
per-class times the profiler measured, never per family, so a new architecture made of
known operator classes is predicted from what those classes cost elsewhere. Each class
is a non-negative least-squares fit (scikit-learn ``LinearRegression(positive=True)``)
weighted by 1/step time. A class the corpus barely shows borrows its coefficients
from its physical neighbours (an RNN's FLOPs cost what a GEMM's do, its bytes what an
element-wise op's do); with nothing to borrow it keeps the untuned roofline prior. So does a
term the corpus barely shows within a fitted class: a family whose depthwise convolutions are
the only GEMM-lowered ones, held out, leaves nothing to fit ``l`` from, and its column traffic
then costs what a plain copy's bytes cost (``movement``'s roofline coefficient).

The prediction interval comes from leave-one-family-out residuals on the corpus
itself. The corpus is JSON data; the fitted model is rebuilt from it on first use
(milliseconds) and cached in the process.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
from sklearn.linear_model import LinearRegression

from throughput_model.corpus import MAKE_CORPUS, MIN_POINTS, load_corpus
from throughput_model.counting import LOWERED_CLASSES, OP_CLASSES, class_of_timed_key
from throughput_model.devices import Device, cpu_device
from throughput_model.errors import CorpusError

TERMS = ("roofline", "overlap", "ops", "alloc", "lowered")

BORROW: dict[str, tuple[str, str, str, str]] = {
    "conv": ("gemm", "gemm", "gemm", "elementwise"),
    "conv_depthwise": ("conv", "conv", "conv", "elementwise"),
    "attention": ("gemm", "gemm", "gemm", "reduction"),
    "lstm": ("gemm", "gemm", "attention", "elementwise"),
    "rnn": ("gemm", "gemm", "elementwise", "elementwise"),
    "random": ("math", "math", "math", "math"),
    "embedding": ("movement", "movement", "movement", "movement"),
}
"""Where a class with too little data takes each term's coefficient from (a fused LSTM costs
what a GEMM does per FLOP and what an attention region does per decomposed op); classes not
listed borrow from "elementwise"."""

LOWERED_DONOR = ("movement", TERMS.index("roofline"))
"""The lowered term, shown too little, costs what a plain copy's bytes do: im2col is a copy."""
PRIOR = (1.0, 0.0, 1.0, 0.0, 1.0)
"""The untuned coefficient of each term."""

SINGLE_KERNEL_CLASSES = ("lstm",)
"""Classes that run as one fused kernel on CPUs (oneDNN) and GPUs (cuDNN) alike: the bytes of
their meta-device decomposition (every step's gates) never reach memory, so only FLOPs count."""

MIN_SHARE = 0.01
"""A class is fitted when at least ``MIN_POINTS`` corpus points spend this share of their step in it."""
INTERVAL_QUANTILES = (0.05, 0.95)


def corpus_device(corpus: Mapping) -> Device:
    """The device the corpus was measured on: a GPU's as the corpus records it (python -m bench.gpu),
    a CPU with the numbers measured while profiling."""
    if corpus.get("device", {}).get("kind") == "gpu":
        return Device(**corpus["device"])
    numbers = corpus["device_numbers"]
    return cpu_device(numbers, int(corpus.get("threads", 1)), str(corpus.get("cpu_model", "unknown cpu")))


# ---------------------------------------------------------------- the physical model


def class_terms(features: Mapping[str, float], device: Device) -> dict[str, np.ndarray]:
    """Per class, the terms of :data:`TERMS` in seconds at the device's peaks."""
    flops_rate = device.flops_for(features.get("dtype_bytes", 4.0))
    terms = {}
    for c in OP_CLASSES:
        compute = features.get(f"{c}_flops", 0.0) / flops_rate
        memory = 0.0 if c in SINGLE_KERNEL_CLASSES else features.get(f"{c}_bytes", 0.0) / device.memory_bandwidth
        terms[c] = np.array([
            max(compute, memory),
            min(compute, memory),
            features.get(f"{c}_ops", 0.0) * device.op_overhead_s,
            features.get(f"{c}_alloc", 0.0) / device.memory_bandwidth,
            features.get(f"{c}_lowered", 0.0) / device.memory_bandwidth,
        ])
    return terms


def roofline_seconds(features: Mapping[str, float], device: Device) -> float:
    """The analytic roofline from FLOPs and bytes alone: each class at the slower of its two peaks."""
    return float(sum(t[0] for t in class_terms(features, device).values()))


def prior_seconds(features: Mapping[str, float], device: Device) -> float:
    """The untuned physical prior: the roofline plus the fixed cost of every op."""
    return float(sum(t[0] + t[2] for t in class_terms(features, device).values()))


def allreduce_seconds(features: Mapping[str, float], gpus: int, device: Device) -> float:
    """Ring all-reduce of the gradients over ``gpus`` devices at the interconnect's bandwidth."""
    if gpus <= 1:
        return 0.0
    grad = features.get("grad_bytes", features.get("param_bytes", 0.0))
    return 2.0 * (gpus - 1) / gpus * grad / device.interconnect_bandwidth


# ---------------------------------------------------------------- the fitted model


Coefficients = tuple[float, float, float, float, float]


@dataclass(frozen=True)
class FittedModel:
    """Per-class coefficients (dimensionless multipliers of the roofline terms) and the
    held-out log-residual quantiles that make the interval."""

    coefficients: dict[str, Coefficients]
    sources: dict[str, str]
    """Per class: "fitted (N points)" or "borrowed from ..." (per term; "prior" = 1.0)."""
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
                 f"{'class':<14}" + "".join(f"{t:>10}" for t in TERMS) + "  source"]
        for c in OP_CLASSES:
            shown = [f"{v:>10.3f}" if term != "lowered" or c in LOWERED_CLASSES else f"{'-':>10}"
                     for term, v in zip(TERMS, self.coefficients[c])]
            lines.append(f"{c:<14}" + "".join(shown) + f"  {self.sources[c]}")
        low, high = self.log_interval
        lines.append(f"90% interval of measured/predicted step time (held-out families): "
                     f"{math.exp(low):.2f}x .. {math.exp(high):.2f}x")
        return "\n".join(lines)


@dataclass(frozen=True)
class Design:
    """The corpus as arrays: per class the term matrix (n x 4) and measured seconds (n)."""

    X: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    steps: np.ndarray
    families: np.ndarray

    @classmethod
    def of(cls, points: list[dict], device: Device) -> "Design":
        steps = np.array([p["step_s"] for p in points])
        terms = [class_terms(p["features"], device) for p in points]
        X = {c: np.array([t[c] for t in terms]).reshape(len(points), len(TERMS)) for c in OP_CLASSES}
        y = {c: np.zeros(len(points)) for c in OP_CLASSES}
        for i, p in enumerate(points):
            total = sum(p["op_s"].values())
            for key, seconds in p["op_s"].items():  # the instrumented split, scaled to the plain step's median
                y[class_of_timed_key(key)][i] += steps[i] * seconds / total if total > 0 else 0.0
        return cls(X, y, steps, np.array([p["family"] for p in points]))

    def predict(self, coefficients: Mapping[str, Coefficients], rows: np.ndarray) -> np.ndarray:
        return sum(self.X[c][rows] @ np.asarray(coefficients[c]) for c in OP_CLASSES)


def fit_coefficients(design: Design, rows: np.ndarray) -> tuple[dict[str, Coefficients], dict[str, str]]:
    """Fit every class that the ``rows`` show enough of, on the terms they show enough of; borrow
    or keep the prior for the rest."""
    steps = design.steps[rows]
    weights = 1.0 / np.maximum(steps, 1e-9)  # between absolute and relative error: big steps count more
    fitted: dict[str, list[float | None]] = {}
    sources: dict[str, str] = {}
    for c in OP_CLASSES:
        y = design.y[c][rows]
        shown = int(np.sum(y >= MIN_SHARE * steps))
        if shown < MIN_POINTS:
            continue
        X = design.X[c][rows]
        terms = [t for t, term in enumerate(TERMS) if term != "lowered" or _shown(X[:, t], steps)]
        regression = LinearRegression(positive=True, fit_intercept=False)
        regression.fit(X[:, terms], y, sample_weight=weights)
        fitted[c] = [None] * len(TERMS)
        for t, value in zip(terms, regression.coef_):
            fitted[c][t] = float(value)
        sources[c] = f"fitted ({shown} points)"
    coefficients: dict[str, Coefficients] = {}
    for c in OP_CLASSES:
        donors = BORROW.get(c, ("elementwise",) * (len(TERMS) - 1))
        values, borrowed = [], []
        for t, term in enumerate(TERMS):
            own = fitted.get(c, [None] * len(TERMS))[t]
            if own is not None or (term == "lowered" and c not in LOWERED_CLASSES):
                values.append(own or 0.0)  # a class that never runs GEMM-lowered has no lowered term
                continue
            donor, donor_term = LOWERED_DONOR if term == "lowered" else (donors[t], t)
            value = fitted.get(donor, [None] * len(TERMS))[donor_term]
            values.append(PRIOR[t] if value is None else value)
            borrowed.append(f"{term} from {'prior' if value is None else donor}")
        coefficients[c] = tuple(values)  # type: ignore[assignment]
        if c not in sources:
            sources[c] = "borrowed: " + ", ".join(borrowed)
        elif borrowed:
            sources[c] += "; borrowed " + ", ".join(borrowed)
    return coefficients, sources


def _shown(column: np.ndarray, steps: np.ndarray) -> bool:
    """Whether a term is at least :data:`MIN_SHARE` of the step (at coefficient 1) in :data:`MIN_POINTS` rows."""
    return int(np.sum(column >= MIN_SHARE * steps)) >= MIN_POINTS


def fit(points: list[dict], device: Device, with_interval: bool = True) -> FittedModel:
    """Fit on ``points``; the interval comes from leaving each family out in turn."""
    if len(points) < MIN_POINTS:
        raise CorpusError(f"{len(points)} corpus points are too few to fit (need {MIN_POINTS}); profile more")
    design = Design.of(points, device)
    everything = np.ones(len(points), dtype=bool)
    coefficients, sources = fit_coefficients(design, everything)
    families = tuple(dict.fromkeys(p["family"] for p in points))
    interval = (math.log(0.5), math.log(2.0))
    if with_interval:
        residuals = held_out_log_residuals(design)
        if len(residuals) >= 2:
            low, high = np.quantile(residuals, INTERVAL_QUANTILES)
            interval = (float(low), float(high))
    return FittedModel(coefficients, sources, device, len(points), families, interval)


def held_out_log_residuals(design: Design) -> np.ndarray:
    """log(measured / predicted) of every point, predicted by a fit that left its family out."""
    residuals: list[np.ndarray] = []
    for family in dict.fromkeys(design.families):
        test = design.families == family
        if test.all() or np.sum(~test) < MIN_POINTS:
            continue
        coefficients, _ = fit_coefficients(design, ~test)
        residuals.append(np.log(design.steps[test] / design.predict(coefficients, test)))
    return np.concatenate(residuals) if residuals else np.array([])


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
        raise CorpusError(f"cannot read the corpus {path}: {exc}; {MAKE_CORPUS}") from None
    return _fitted_cached(str(path), mtime)
