"""The throughput model on the device: the zoo's families measured there, and how well it predicts.

The zoo's points are profiled on the device (throughput_model/profile.py), interleaved by
family so that a budget cut short still covers every family, until the budget is spent. On
them: the roofline prior's error before any fitting (the step ``throughput_model.predict``
gives for this GPU from the vendor table, what the controller starts a job from), and the
leave-one-family-out error of the model fitted on the device's own points
(throughput_model/evaluate.py). The device's peaks are measured too (raw data); the fit uses
the vendor table's where the GPU is in it, the measured ones otherwise.
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict
from datetime import datetime, timezone
from itertools import zip_longest
from typing import Any, Callable

import torch

from bench.gpu_check.device import CheckDevice
from throughput_model import evaluate, profile
from throughput_model.corpus import cpu_model_name
from throughput_model.devices import Device, cpu_device, lookup, measure_cpu_numbers
from throughput_model.errors import ThroughputModelError
from throughput_model.zoo import ZOO, ZooModel


def interleaved(points: list[tuple[ZooModel, int]]) -> list[tuple[ZooModel, int]]:
    """The points, one family after another in turn: the first of each family, then the second..."""
    families: dict[str, list[tuple[ZooModel, int]]] = {}
    for point in points:
        families.setdefault(point[0].family, []).append(point)
    return [p for row in zip_longest(*families.values()) for p in row if p is not None]


def measure_gpu(name: str) -> Device:
    """This GPU's peaks, measured: fp32 and bf16 GEMM, copy bandwidth, one tiny op's cost."""
    def seconds(run: Callable[[], Any], repeats: int) -> float:
        run()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / repeats

    n = 8192
    a32 = torch.randn(n, n, device="cuda")
    a16 = a32.to(torch.bfloat16)
    flops32 = 2 * n ** 3 / seconds(lambda: a32 @ a32, 5)
    flops16 = 2 * n ** 3 / seconds(lambda: a16 @ a16, 10)
    big = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    copy = torch.empty_like(big)
    bandwidth = 2 * big.numel() * 4 / seconds(lambda: copy.copy_(big), 10)
    s, t, u = (torch.randn(8, device="cuda") for _ in range(3))
    op = seconds(lambda: torch.add(s, t, out=u), 2000)
    memory = float(torch.cuda.get_device_properties(0).total_memory)
    del a32, a16, big, copy
    return Device(name, "gpu", flops32, flops16, bandwidth, bandwidth / 10, op, memory, True,
                  source=f"measured on this GPU ({name}): fp32/bf16 GEMM {n}^3, 256 MiB copy, tiny-op launch")


def devices_for(device: CheckDevice) -> tuple[Device, dict[str, Any]]:
    """The device the fit uses, and what was measured and looked up (raw data). The emulated
    device's points run on this CPU at one thread, measured as the CPU corpus is."""
    if device.emulated:
        numbers = measure_cpu_numbers(1)
        cpu = cpu_device(numbers, 1, cpu_model_name())
        return cpu, {"fit_device": asdict(cpu), "device_numbers": numbers}
    measured = measure_gpu(device.name)
    try:
        table = lookup(device.name)
    except ThroughputModelError as exc:
        return measured, {"measured": asdict(measured), "table": None, "table_error": str(exc),
                          "fit_device": asdict(measured)}
    return table, {"measured": asdict(measured), "table": asdict(table), "fit_device": asdict(table)}


def prior_step_s(features: dict, device: CheckDevice) -> float:
    """The step time ``throughput_model.predict`` gives before any fitting: this GPU's roofline prior
    (the CPU's fitted model on the emulated device, which has no prior of its own)."""
    from throughput_model.predict import predict

    prediction = predict(features, device="cpu" if device.emulated else device.name)
    return features["batch_size"] / prediction.samples_per_s


def run(device: CheckDevice, budget_s: float, points: list[tuple[ZooModel, int]] | None = None, steps: int = 10,
        warmup: int = 3, instrumented: int = 2, progress=print) -> dict[str, Any]:
    """Profile within ``budget_s`` and evaluate; the corpus (raw data) is in the result."""
    started = time.monotonic()
    fit_device, devices = devices_for(device)
    todo = interleaved(points if points is not None else profile.select(quick=False, models=ZOO))
    threads = torch.get_num_threads()
    if device.emulated:
        torch.set_num_threads(1)  # as the CPU corpus was profiled
    records, failed = [], []
    try:
        for spec, batch in todo:
            if time.monotonic() - started > budget_s:
                break
            try:
                records.append(profile.profile_point(spec, batch, steps, warmup, instrumented,
                                                     device=device.torch_device))
            except Exception as exc:  # noqa: BLE001 - one model that fails on the device must not end the part
                failed.append({"model": spec.name, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:300]})
            gc.collect()
    finally:
        torch.set_num_threads(threads)
    families = sorted({r["family"] for r in records})
    progress(f"  throughput model: {len(records)} of {len(todo)} points profiled ({len(families)} families), "
             f"{len(failed)} failed, {time.monotonic() - started:.0f} s")
    corpus = {"version": profile.CORPUS_VERSION, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "device": asdict(fit_device), "steps": steps, "points": records,
              "device_numbers": devices.get("device_numbers"), "threads": 1, "cpu_model": cpu_model_name()}
    prior_errors = []
    if device.emulated or devices.get("table") is not None:  # a GPU not in the table has no prior to judge
        for record in records:
            predicted = prior_step_s(record["features"], device)
            prior_errors.append(abs(predicted - record["step_s"]) / record["step_s"])
    result: dict[str, Any] = {
        "points": len(records), "points_planned": len(todo), "families": families, "failed": failed,
        "devices": devices,
        "prior_mean_ape": sum(prior_errors) / len(prior_errors) if prior_errors else None,
        "prior_basis": "the CPU's fitted model (emulated device)" if device.emulated
                       else "throughput_model.predict's roofline prior for this GPU (vendor table, no fit)",
        "corpus": corpus,
    }
    if len(families) >= 2:
        evaluation = evaluate.evaluate(corpus)
        result["evaluation"] = evaluation
        result["fitted_lofo_mean_ape"] = evaluation["pooled"]["model"]["mean_ape"]
        result["fitted_lofo_p90_ape"] = evaluation["pooled"]["model"]["p90_ape"]
        result["roofline_prior_mean_ape"] = evaluation["pooled"]["prior"]["mean_ape"]
    else:
        result["fitted_lofo_mean_ape"] = None
        result["evaluation_error"] = "fewer than two families profiled: leave-one-family-out needs two"
    return result
