"""Measure real training steps of the zoo on the local device: the corpus the model learns from.

For each (architecture, batch size) point: the features (:func:`features.describe` on the
meta device, exactly what a job would send), a few warm-up steps, instrumented steps that
time every operator, filed by phase, class and op name (``op_s``; so a later change of the
class rules needs no new profile), (the same :class:`counting.StepAccountant` that counts the
features, given a clock) in the middle of plain timed steps (forward, backward, optimizer separately)
whose medians are the ground truth. The step-time samples are kept, in order, so the online
correction can be replayed on them.

Profiling runs at one thread (``torch.set_num_threads(1)``) unless told otherwise, and times
are the thread's CPU time (``time.thread_time``): at one thread every op runs on the calling
thread, so this equals the wall time of an idle machine while ignoring the time other
processes of a shared machine take the core (the wall-clock median is kept too, as
``step_wall_s``). The device is measured before the first point, between families and after
the last; the median of those measurements is the corpus's device, and their spread and the
load averages recorded with them say how much the machine drifted or was shared.
On a GPU (``device="cuda"``: ``python -m bench.gpu``) phases and ops are timed by the wall
clock with the device synchronised around each (:func:`cuda_clock`).
"""
from __future__ import annotations

import gc
import json
import logging
import os
import statistics
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import torch

from throughput_model.counting import account_step, cpu_clock
from throughput_model.corpus import cpu_model_name
from throughput_model.devices import calibration, cpu_device, median_numbers
from throughput_model.features import OPTIMIZERS, describe
from throughput_model.zoo import ZOO, ZooModel, classification_loss

log = logging.getLogger(__name__)

CORPUS_VERSION = 1


def cuda_clock() -> float:
    """The clock a GPU is profiled with: the wall clock once the device has done all queued work."""
    torch.cuda.synchronize()
    return time.perf_counter()


def profile_point(model_spec: ZooModel, batch: int, steps: int, warmup: int = 3, instrumented: int = 3,
                  device: str = "cpu") -> dict:
    """Profile one architecture at one batch size on ``device`` ("cpu", or "cuda": phases and
    ops timed by :func:`cuda_clock`); returns one corpus record."""
    torch.manual_seed(0)
    model = model_spec.make().train()
    inputs = model_spec.batch(batch)
    features = describe(model, inputs, loss_fn=classification_loss, optimizer=model_spec.optimizer).features
    model.to(device)
    inputs = inputs.to(device)
    factory = OPTIMIZERS[model_spec.optimizer]
    assert factory is not None
    optimizer = factory(model.parameters())
    clock = cpu_clock if device == "cpu" else cuda_clock

    def timed_step() -> tuple[float, float, float, float]:
        """(forward, backward, optimizer) seconds by ``clock``, and the step's wall seconds."""
        optimizer.zero_grad(set_to_none=True)
        start = clock()
        wall = time.perf_counter()
        loss = classification_loss(model(inputs))
        forward_done = clock()
        loss.backward()
        backward_done = clock()
        optimizer.step()
        end = clock()
        return forward_done - start, backward_done - forward_done, end - backward_done, time.perf_counter() - wall

    for _ in range(warmup):
        timed_step()
    op_runs: list[dict[str, float]] = []
    samples = [timed_step() for _ in range(steps // 2)]
    for _ in range(instrumented):
        optimizer.zero_grad(set_to_none=True)
        result = account_step(lambda: classification_loss(model(inputs)), optimizer.step, clock=clock)
        if result.failed_phase is not None:
            raise RuntimeError(f"{model_spec.name}: instrumented step failed in {result.failed_phase}: {result.error}")
        op_runs.append(result.tally.op_seconds)
    samples += [timed_step() for _ in range(steps - steps // 2)]
    totals = [sum(s[:3]) for s in samples]
    return {
        "family": model_spec.family,
        "model": model_spec.name,
        "batch": batch,
        "optimizer": model_spec.optimizer,
        "features": features,
        "step_s": statistics.median(totals),
        "forward_s": statistics.median(s[0] for s in samples),
        "backward_s": statistics.median(s[1] for s in samples),
        "optimizer_s": statistics.median(s[2] for s in samples),
        "step_samples_s": [round(t, 7) for t in totals],
        "step_wall_s": statistics.median(s[3] for s in samples),
        "op_s": {key: statistics.median(run.get(key, 0.0) for run in op_runs)
                 for key in sorted(set().union(*op_runs))},
    }


def select(quick: bool, families: Iterable[str] | None = None, models: Iterable[ZooModel] = ZOO) -> list[tuple[ZooModel, int]]:
    """The (architecture, batch) points to profile: all, or the quick subset (two batch sizes of
    the architectures marked quick), optionally restricted to some families."""
    wanted = set(families) if families else None
    points = []
    for spec in models:
        if wanted is not None and spec.family not in wanted:
            continue
        if quick and not spec.quick:
            continue
        for batch in ((spec.batches[0], spec.batches[-1]) if quick else spec.batches):
            points.append((spec, batch))
    return points


def profile(
    points: list[tuple[ZooModel, int]],
    steps: int,
    threads: int = 1,
    progress: Callable[[int, int, dict], None] | None = None,
) -> dict:
    """Profile ``points`` at ``threads`` threads and return the corpus (a JSON-ready dict)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        started = time.time()
        calibrations = [calibration(threads)]
        records = []
        for index, (spec, batch) in enumerate(points):
            if index > 0 and spec.family != points[index - 1][0].family:
                calibrations.append(calibration(threads))
            record = profile_point(spec, batch, steps)
            records.append(record)
            if progress is not None:
                progress(index + 1, len(points), record)
            gc.collect()
        calibrations.append(calibration(threads))
    finally:
        torch.set_num_threads(previous)
    numbers = median_numbers(calibrations)  # before the first point, between families, after the last
    device = cpu_device(numbers, threads, cpu_model_name())
    return {
        "version": CORPUS_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cpu_model": cpu_model_name(),
        "device": asdict(device),
        "device_numbers": numbers,
        "device_numbers_before": calibrations[0]["numbers"],
        "device_numbers_after": calibrations[-1]["numbers"],
        "calibrations": calibrations,
        "threads": threads,
        "steps": steps,
        "wall_s": round(time.time() - started, 1),
        "loadavg_before": calibrations[0]["loadavg"],
        "loadavg_after": calibrations[-1]["loadavg"],
        "cpus_online": os.cpu_count(),
        "points": records,
    }




def save(corpus: dict, path: Path) -> None:
    """Write the corpus atomically (JSON, never a pickle)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(corpus, indent=None, separators=(",", ":")) + "\n")
    temporary.replace(path)


def refresh_features(corpus: dict) -> dict:
    """Recount the features of every point (after a change to the counting), keeping the
    measurements: features depend only on the architecture, batch size and optimizer."""
    from throughput_model.zoo import zoo_model

    for record in corpus["points"]:
        spec = zoo_model(record["model"])
        record["features"] = describe(spec.make(), spec.batch(record["batch"]), loss_fn=classification_loss,
                                      optimizer=record["optimizer"]).features
    return corpus
