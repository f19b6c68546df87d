"""How long a job will run, in samples, learnt from the node's history of recurring jobs (A-SRPT).

Most jobs recur: the same script, the same model, night after night. A random forest
(scikit-learn) maps what a job declares at registration (its name's words, its GPUs, its batch
size) and its model's features to the samples its completed runs trained on. A job that
declares its length (``adloader run --samples``) is predicted by a forest of the declaring runs
as the fraction of that length it will train: jobs stop early, and a kind of job that declares
100 epochs and stops at 30 does so again. The trees' spread gives an interval; a prediction
whose interval is wide is uncertain, and a job is then ranked by the interval's pessimistic
(long) end, never by the point guess: ranked short by a guess, a long job would take the node
from jobs that are truly short.

Fallbacks, in order (:func:`ranking_length`): the forest's prediction, the job's declared
length, then unknown (None).

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
    declared: float | None = None
    """The length the run declared at registration (``adloader run --samples``); None: none."""

    @property
    def declares(self) -> bool:
        return self.declared is not None and self.declared > 0


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
    """A forest fitted on completed runs; :meth:`predict` gives a length and its interval.

    ``of_declared``: learn, from the runs that declared a length, the fraction of it they
    trained, and predict a job as that fraction of its own declared length (a forest cannot
    extrapolate: learnt as absolute lengths, a job declaring ten times anything seen before
    would be predicted as long as the longest). Otherwise: absolute lengths from every run, for
    jobs that declare none."""

    def __init__(self, records: Sequence[LengthRecord], seed: int = 0, of_declared: bool = False) -> None:
        from sklearn.ensemble import RandomForestRegressor  # scikit-learn only where lengths are learnt

        usable = [r for r in records if r.samples is not None and r.samples > 0 and (r.declares or not of_declared)]
        if len(usable) < MIN_RECORDS:
            which = " declaring a length" if of_declared else ""
            raise ValueError(f"{len(usable)} completed run(s){which}: at least {MIN_RECORDS} are needed to learn lengths")
        self.of_declared = of_declared
        self.keys = sorted({key for r in usable for key in r.features})
        self.forest = RandomForestRegressor(n_estimators=TREES, min_samples_leaf=1, random_state=seed)
        self.forest.fit(self._matrix(usable), np.log([float(r.samples or 0.0) / self._unit(r) for r in usable]))

    def _unit(self, record: LengthRecord) -> float:
        """What the forest's target is a multiple of: the declared length, or one sample."""
        if not self.of_declared:
            return 1.0
        if not record.declares:
            raise ValueError(f"job {record.name} declares no length: predict it with a forest of absolute lengths")
        return float(record.declared or 1.0)

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
        units = np.asarray([self._unit(job) for job in jobs], dtype=float)
        per_tree = np.exp(np.stack([tree.predict(rows) for tree in self.forest.estimators_])) * units
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


def fitted_forests(records: Sequence[LengthRecord], seed: int = 0) -> dict[bool, LengthForest]:
    """The forests ``records`` can fit, by ``of_declared``: absolute lengths (every completed run)
    and fractions of the declared length (the declaring runs); one with too few runs is left out."""
    forests = {}
    for of_declared in (False, True):
        try:
            forests[of_declared] = LengthForest(records, seed=seed, of_declared=of_declared)
        except ValueError:
            continue
    return forests


def leave_own_out_error(records: Sequence[LengthRecord], seed: int = 0) -> dict[str, float]:
    """Each job (by name) predicted by the forests fitted on every other job's runs, none of
    its own (a declaring run by the fractions' forest): median and 90th-percentile relative
    error of the point prediction, how often the truth lay in the interval, and how often the
    ranked length (pessimistic where uncertain) was not below the truth. Over the runs that
    could be predicted (at least MIN_RECORDS others of their kind). Over the runs that declared
    a length, ``declaring_*``: the forest's errors, ``declared_*``: the declared lengths', taken
    as they are."""
    names = sorted({r.name for r in records})
    errors, declaring_errors, declared_errors, inside, not_short, uncertain = [], [], [], 0, 0, 0
    for name in names:
        own = [r for r in records if r.name == name and r.samples]
        forests = fitted_forests([r for r in records if r.name != name], seed=seed)
        for run in own:
            forest = forests.get(run.declares)
            if forest is None:
                continue
            prediction, truth = forest.predict(run), float(run.samples or 0.0)
            errors.append(abs(prediction.samples - truth) / truth)
            if run.declares:
                declaring_errors.append(errors[-1])
                declared_errors.append(abs(float(run.declared or 0.0) - truth) / truth)
            inside += prediction.low <= truth <= prediction.high
            ranked, _ = ranking_length(prediction, None)
            not_short += ranked is not None and ranked >= truth * 0.999
            uncertain += prediction.uncertain
    if not errors:
        return {"runs": 0}
    figures = {"runs": float(len(errors)), "median_error": statistics.median(errors), "p90_error": _p90(errors),
               "in_interval": inside / len(errors), "ranked_not_short": not_short / len(errors),
               "uncertain": uncertain / len(errors), "declaring_runs": float(len(declared_errors))}
    if declared_errors:
        figures |= {"declaring_median_error": statistics.median(declaring_errors),
                    "declaring_p90_error": _p90(declaring_errors),
                    "declared_median_error": statistics.median(declared_errors),
                    "declared_p90_error": _p90(declared_errors)}
    return figures


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


STOPS_AT = {"finetune": (0.3, 0.6), "pretrain": (1.0, 1.0)}
"""The fraction of its declared length a run of each kind trains in :func:`recurring_history`:
fine-tunes stop early, pretraining runs its budget; evals declare nothing."""


def recurring_history(seed: int = 0, families: int = 24, runs_per_family: int = 4) -> list[LengthRecord]:
    """A generated history of recurring jobs: ``families`` jobs (names like ``bert-finetune-3``),
    each of a model size and kind whose length follows from them (fine-tunes are short,
    pretraining long, larger models run fewer samples), rerun ``runs_per_family`` times with
    ±10% noise. Jobs of a kind share words and feature scales with other families, so a job's
    length can be learnt without its own runs, as on a node where new jobs resemble old ones.
    Fine-tunes and pretraining declare a length (``STOPS_AT``: the fraction they train of it);
    evals declare none."""
    rng = random.Random(seed)
    budgets = random.Random(f"{seed}-declared")  # its own stream: the lengths stay those of the seed
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
        declared = round(length / budgets.uniform(*STOPS_AT[kind])) if kind in STOPS_AT else None
        for run in range(runs_per_family):
            samples = round(length * rng.uniform(0.9, 1.1))
            records.append(LengthRecord(name=f"{model}-{kind}-{family}", gpus=gpus, batch_size=batch,
                                        features=features, samples=min(samples, declared or samples),
                                        declared=declared))
    return records
