"""The controller's first estimate of a job's max throughput M: model plus the node's history.

In order:

1. the job ran here before with exactly these features and GPU count: the median of
   the M those runs measured (their range is the interval);
2. otherwise ``throughput_model.predict`` (fitted on the CPU corpus, or the roofline prior
   on a GPU), multiplied by this node's own correction once it has finished at least
   ``min_history`` jobs with features: the median ratio of measured M to what the model
   says for them, recomputed from their stored features so the correction always refers to
   the current model. That is how a node whose GPUs the prior gets wrong learns its real
   efficiency from its own jobs.

Anything the model cannot answer (no features, unknown device) gives None: the job starts
unpredicted and measurements take over, as they do for every job after a few reports.
"""
from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import Mapping

from controller.history import JobHistory
from throughput_model.errors import ThroughputModelError
from throughput_model.predict import predict

log = logging.getLogger(__name__)

MIN_HISTORY = 3
"""Finished jobs with features and a measured M needed before the node corrects the model."""


def predicted_max_throughput(
    features: Mapping[str, float] | None,
    gpus: int,
    device: str = "cpu",
    history: JobHistory | None = None,
    *,
    corpus: Path | None = None,
    min_history: int = MIN_HISTORY,
    said: set[str] | None = None,
) -> tuple[float, float, float] | None:
    """(M, low, high) samples/s for a job with ``features`` on ``gpus`` x ``device``, or None. Earlier
    runs are looked up with the job's own GPU count (0 for a job without a GPU, as its runs were
    recorded); the model counts such a job as one device (it computes where it runs). ``said``: the
    reasons for no prediction already logged, each logged once (None: log every time)."""
    if not features:
        return None
    if history is not None:
        recurring = history.lookup_features(features, gpus, device)
        if recurring is not None and recurring.max_throughput and recurring.max_throughput_range:
            low, high = recurring.max_throughput_range
            log.info("prediction from %d earlier run(s) with the same features: M=%.1f/s", recurring.runs,
                     recurring.max_throughput)
            return recurring.max_throughput, low, high
    try:
        prediction = predict(features, gpus=max(1, gpus), device=device, corpus=corpus)
    except ThroughputModelError as exc:
        if said is None or str(exc) not in said:
            log.warning("no throughput prediction (%s); the job starts unpredicted", exc)
        if said is not None:
            said.add(str(exc))
        return None
    estimate, low, high = prediction.samples_per_s, prediction.low, prediction.high
    if history is not None:
        ratios = history_ratios(history, device, corpus)
        if len(ratios) >= min_history:
            logs = [math.log(r) for r in ratios]
            centre = statistics.median(logs)
            spread = statistics.median(abs(v - centre) for v in logs) * 1.4826
            factor = math.exp(centre)
            estimate *= factor
            low = min(low * factor, estimate * math.exp(-2 * spread))
            high = max(high * factor, estimate * math.exp(2 * spread))
            log.info("prediction corrected by this node's history (%d jobs): x%.2f", len(ratios), factor)
    return estimate, low, high


def history_ratios(history: JobHistory, device: str, corpus: Path | None = None) -> list[float]:
    """measured M / model M for each finished job of ``device`` with features."""
    ratios = []
    for record in history.records(device=device):
        try:
            model = predict(record.features or {}, gpus=max(1, record.gpus), device=device, corpus=corpus).samples_per_s
        except ThroughputModelError:
            continue
        if model > 0 and record.measured_sps:
            ratios.append(record.measured_sps / model)
    return ratios


class ThroughputPredictor:
    """The registry's predictor: ``(features, gpus) -> (M, low, high) | None`` for this node."""

    def __init__(self, device: str = "cpu", history: JobHistory | None = None, corpus: Path | None = None,
                 min_history: int = MIN_HISTORY) -> None:
        self.device = device
        self.history = history
        self.corpus = corpus
        self.min_history = min_history
        self._said: set[str] = set()
        """Why jobs got no prediction, logged once each: the registry asks again every control step
        for a job without one (a controller's log once said the same WARNING twice a second)."""

    def __call__(self, features: dict[str, float], gpus: int) -> tuple[float, float, float] | None:
        return predicted_max_throughput(features, gpus, self.device, self.history, corpus=self.corpus,
                                        min_history=self.min_history, said=self._said)
