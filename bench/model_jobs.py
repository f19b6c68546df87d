"""Mix jobs that name a model: the features they send at registration.

A job of a mix may say ``"model": "<name>"``, a model of the throughput model's shipped
corpus (throughput_model/data/corpus.json) at the job's batch size. Its launcher then
passes the model's features with ``adloader run --model-features``, as a real job calling
``adloader.describe_model`` would, and the controller predicts its M from them. The
corpus holds each model's step time measured on this machine's CPU: a mix sets
``compute_ms_per_batch`` to it (the CPU-proxy step standing in for the GPU's), so the
prediction is judged against the step the job really emulates.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from bench.mix import JobSpec, Mix, MixError


@functools.cache
def _corpus_points() -> dict[tuple[str, int], dict]:
    from throughput_model.corpus import load_corpus

    return {(point["model"], int(point["batch"])): point for point in load_corpus()["points"]}


def corpus_point(spec: JobSpec) -> dict:
    """The corpus entry of the job's model at its batch size; MixError if there is none."""
    point = _corpus_points().get((str(spec.model), spec.batch_size))
    if point is None:
        known = sorted({f"{m}@{b}" for m, b in _corpus_points()})
        raise MixError(f"job {spec.name}: model {spec.model!r} at batch {spec.batch_size} is not in the "
                       f"throughput model's corpus; pick one of: {', '.join(known[:12])}, ...")
    return point


def check_models(mix: Mix) -> None:
    """Every job that names a model names one the corpus has (before anything starts)."""
    for spec in mix.jobs:
        if spec.model is not None:
            corpus_point(spec)


def write_features(spec: JobSpec, directory: Path) -> Path:
    """The job's model features as the JSON file ``adloader run --model-features`` reads."""
    path = directory / f"{spec.name}.features.json"
    path.write_text(json.dumps(corpus_point(spec)["features"]))
    return path
