"""How long a job will run, in samples, learnt from the node's history of recurring jobs (A-SRPT).

Most jobs recur: the same script, the same model, night after night. A random forest
(scikit-learn) maps what a job declares at registration (its name's words, its GPUs, its batch
size) and its model's features to the samples its completed runs trained on. The trees' spread
gives an interval; a prediction whose interval is wide is uncertain, and a job is then ranked by
the interval's pessimistic (long) end, never by the point guess: ranked short by a guess, a long
job would take the node from jobs that are truly short.

Fallbacks, in order (:func:`ranking_length`): the forest's prediction, the job's declared
length (``adloader run --samples``), then unknown (None).

Pure: plain records in, numbers out; no I/O (the controller reads its SQLite history and hands
the records over: controller/remaining.py). :func:`leave_own_out_error` is the judged figure:
each job predicted by a forest trained without any run of its own.
"""
from __future__ import annotations

import math
import random
import re
import statistics
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

NAME_BUCKETS = 32
"""The words of a job's name are hashed into this many counts (the hashing trick): names are
open-ended, a forest needs fixed columns."""
TREES = 32
MIN_RECORDS = 4
"""Fewer completed runs than this: no forest (a single tree's guess is no prediction)."""
INTERVAL = (0.1, 0.9)
"""The per-tree quantiles that make the interval."""
UNCERTAIN_RATIO = 1.5
"""An interval whose high end is more than this many times its low end is uncertain."""


@dataclass(frozen=True)
class LengthRecord:
    """One completed run as the forest learns from it (or a job to predict: ``samples`` None)."""

    name: str
    gpus: int
    samples: float | None = None
    """Samples the run trained on (completed runs only say a job's length)."""
    batch_size: int | None = None
    features: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LengthPrediction:
    samples: float
    """The forest's point prediction (the trees' median)."""
    low: float
    high: float

    @property
    def uncertain(self) -> bool:
        return self.high > UNCERTAIN_RATIO * max(self.low, 1.0)


def name_words(name: str) -> list[str]:
    """The words of a job name: letters only, lower case (``resnet50-nightly_3`` -> resnet, nightly):
    run numbers and dates are not what makes a job long."""
    return [word for word in re.split(r"[^a-z]+", name.lower()) if word]


class LengthForest:
    """A forest fitted on completed runs; :meth:`predict` gives a length and its interval."""

    def __init__(self, records: Sequence[LengthRecord], seed: int = 0) -> None:
        from sklearn.ensemble import RandomForestRegressor  # scikit-learn only where lengths are learnt

        usable = [r for r in records if r.samples is not None and r.samples > 0]
        if len(usable) < MIN_RECORDS:
            raise ValueError(f"{len(usable)} completed run(s): at least {MIN_RECORDS} are needed to learn lengths")
        self.keys = sorted({key for r in usable for key in r.features})
        self.forest = RandomForestRegressor(n_estimators=TREES, min_samples_leaf=1, random_state=seed)
        self.forest.fit(self._matrix(usable), np.log([r.samples for r in usable]))

    def _matrix(self, records: Sequence[LengthRecord]) -> np.ndarray:
        rows = []
        for r in records:
            words = [0.0] * NAME_BUCKETS
            for word in name_words(r.name):
                words[zlib.crc32(word.encode()) % NAME_BUCKETS] += 1.0
            features = [math.log1p(max(0.0, float(r.features.get(key, 0.0)))) for key in self.keys]
            rows.append([float(r.gpus), float(r.batch_size or 0), *words, *features])
        return np.asarray(rows, dtype=float)

    def predict(self, job: LengthRecord) -> LengthPrediction:
        return self.predict_many([job])[0]

    def predict_many(self, jobs: Sequence[LengthRecord]) -> list[LengthPrediction]:
        rows = self._matrix(jobs)
        per_tree = np.exp(np.stack([tree.predict(rows) for tree in self.forest.estimators_]))
        low, middle, high = np.quantile(per_tree, [INTERVAL[0], 0.5, INTERVAL[1]], axis=0)
        return [LengthPrediction(samples=float(m), low=float(lo), high=float(hi)) for lo, m, hi in zip(low, middle, high)]


def ranking_length(prediction: LengthPrediction | None, declared: float | None) -> tuple[float | None, str]:
    """The length a job is ranked by, and where it comes from: the forest's prediction (its
    pessimistic end where uncertain), else the declared length, else None ("unknown")."""
    if prediction is not None:
        if prediction.uncertain:
            return prediction.high, "history, pessimistic end"
        return prediction.samples, "history"
    if declared is not None and declared > 0:
        return float(declared), "declared"
    return None, "unknown"


def leave_own_out_error(records: Sequence[LengthRecord], seed: int = 0) -> dict[str, float]:
    """Each job (by name) predicted by a forest fitted on every other job's runs, none of its
    own: median and 90th-percentile relative error of the point prediction, how often the truth
    lay in the interval, and how often the ranked length (pessimistic where uncertain) was not
    below the truth. Over the jobs that could be predicted (at least MIN_RECORDS others)."""
    names = sorted({r.name for r in records})
    errors, inside, not_short, uncertain = [], 0, 0, 0
    for name in names:
        others = [r for r in records if r.name != name]
        own = [r for r in records if r.name == name and r.samples]
        if len(others) < MIN_RECORDS or not own:
            continue
        forest = LengthForest(others, seed=seed)
        for run, prediction in zip(own, forest.predict_many(own)):
            truth = float(run.samples or 0.0)
            errors.append(abs(prediction.samples - truth) / truth)
            inside += prediction.low <= truth <= prediction.high
            ranked, _ = ranking_length(prediction, None)
            not_short += ranked is not None and ranked >= truth * 0.999
            uncertain += prediction.uncertain
    if not errors:
        return {"runs": 0}
    ordered = sorted(errors)
    return {"runs": float(len(errors)), "median_error": statistics.median(errors),
            "p90_error": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "in_interval": inside / len(errors), "ranked_not_short": not_short / len(errors),
            "uncertain": uncertain / len(errors)}


def recurring_history(seed: int = 0, families: int = 24, runs_per_family: int = 4) -> list[LengthRecord]:
    """A generated history of recurring jobs: ``families`` jobs (names like ``bert-finetune-3``),
    each of a model size and kind whose length follows from them (fine-tunes are short,
    pretraining long, larger models run fewer samples), rerun ``runs_per_family`` times with
    ±10% noise. Jobs of a kind share words and feature scales with other families, so a job's
    length can be learnt without its own runs, as on a node where new jobs resemble old ones."""
    rng = random.Random(seed)
    kinds = {"finetune": 2e4, "pretrain": 4e5, "eval": 4e3}
    models = {"bert": 1.1e8, "resnet": 2.5e7, "gpt": 3.5e8, "vit": 8.6e7}
    records = []
    for family in range(families):
        kind, base = rng.choice(sorted(kinds.items()))
        model, params = rng.choice(sorted(models.items()))
        gpus = rng.choice([1, 2, 4])
        batch = rng.choice([32, 64, 128])
        length = base * (1e8 / params) ** 0.3 * rng.uniform(0.8, 1.25)
        features = {"params": params, "flops_per_sample": params * 6 * rng.uniform(0.9, 1.1)}
        for run in range(runs_per_family):
            records.append(LengthRecord(name=f"{model}-{kind}-{family}", gpus=gpus, batch_size=batch,
                                        features=features, samples=round(length * rng.uniform(0.9, 1.1))))
    return records
