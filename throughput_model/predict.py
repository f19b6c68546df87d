"""Predict a job's max throughput (samples/s, no data stalls) from its features.

On the CPU the fitted model is used (trained on the shipped corpus, measured here;
label: CPU-proxy). GPUs get the physical roofline prior only (:func:`roofline_prior`): each
operator class at the slower of its FLOP and byte roofline divided by an assumed achieved
fraction of peak (``GPU_EFFICIENCY``), plus a launch cost per op; its interval spans a
Python-bound FP32 loop to a mixed-precision one at peak. No coefficient fitted on CPU data
is ever applied to a GPU. Data-parallel jobs add a ring all-reduce of the
gradients over the interconnect: the estimate assumes no overlap with backward, the
interval's high end assumes full overlap.
"""
from __future__ import annotations

import importlib.util
import math
import sys
import types
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from throughput_model.devices import Device, lookup, measure_cpu
from throughput_model.errors import ThroughputModelError, UnknownModel
from throughput_model.fit import allreduce_seconds, class_terms, load_fitted

GPU_EFFICIENCY = (0.15, 0.5, 1.0)
"""Assumed achieved fraction of the roofline on a GPU: (pessimistic, typical, peak). A prior,
not a measurement: the node's own job history corrects it (controller.prediction)."""
GPU_OP_COST = (3.0, 1.0, 0.5)
"""Multipliers of the per-op launch cost at the (slow, typical, fast) ends: a Python-bound eager loop
pays several launches' worth of dispatch per op, a CUDA-graphed one less than one."""
INCOMPLETE_WIDENING = 2.0
"""How much wider the interval is when the features say counting was incomplete."""


class InsufficientFeatures(ThroughputModelError):
    """The features describe no work (empty, or from an older feature version)."""


@dataclass(frozen=True)
class Prediction:
    """Max throughput of a job and how it was obtained."""

    samples_per_s: float
    low: float
    high: float
    step_seconds: float
    """Predicted seconds per step (forward + backward + optimizer + all-reduce)."""
    gpus: int
    device: str
    basis: str
    """"fitted (CPU-proxy)" or "physical roofline prior only (not calibrated on this GPU)"."""
    calibrated: bool
    allreduce_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        text = (f"{self.samples_per_s:,.1f} samples/s (interval {self.low:,.1f} .. {self.high:,.1f}) on "
                f"{self.gpus} x {self.device}, step {self.step_seconds * 1e3:.2f} ms; {self.basis}")
        return text + "".join(f"\n  note: {n}" for n in self.notes)


def require_work(features: Mapping[str, float]) -> None:
    """InsufficientFeatures unless ``features`` count a step's work. A model whose forward pass
    could not be counted (neither on the meta device nor on stand-ins) has no counted work, and a
    step estimated from what remains (its optimizer) was off by 400x to 100,000x on the public
    set: such a job is measured only, never predicted."""
    if features.get("count_complete", 1.0) < 1.0 and features.get("flops_forward", 0.0) <= 0:
        raise InsufficientFeatures("the model's forward pass could not be counted (describe_model's notes say "
                                   "why): nothing to predict from, so the job is measured only")
    if float(features.get("batch_size", 0.0)) <= 0 or features.get("ops_total", 0.0) <= 0:
        raise InsufficientFeatures("the features describe no work (batch_size or ops_total missing); "
                                   "send adloader.describe_model(model, batch) output")


def resolve_device(name: str) -> Device:
    """"cpu" (this host at torch's current thread count), "cpu:N" (N threads), or a GPU name."""
    lowered = name.strip().lower()
    if lowered.startswith("cpu:"):
        threads = lowered.split(":", 1)[1]
        if not threads.isdigit() or int(threads) < 1:
            raise ThroughputModelError(f"bad device {name!r}: write cpu:N with N >= 1 threads")
        return measure_cpu(int(threads))
    return lookup(name)


def predict(
    features: Mapping[str, float],
    gpus: int = 1,
    device: str | Device = "cpu",
    corpus: Path | None = None,
) -> Prediction:
    """Max throughput of the job ``features`` describes on ``gpus`` devices of kind ``device``."""
    require_work(features)
    target = device if isinstance(device, Device) else resolve_device(device)
    batch = float(features.get("batch_size", 0.0))
    gpus = max(1, int(gpus))
    notes: list[str] = []
    comm = allreduce_seconds(features, gpus, target)
    if target.kind == "cpu":
        model = load_fitted(corpus)
        if target.source == model.device.source:
            target = model.device  # the host the corpus was profiled on: its long, two-sided measurement
        classes = model.class_seconds(features, target)
        compute = sum(classes.values())
        low_ratio, high_ratio = math.exp(model.log_interval[0]), math.exp(model.log_interval[1])
        cheapest, dearest = _optimizer_range(features, classes["optimizer"], classes["optimizer"])
        slow, fast = (compute + dearest) * high_ratio, (compute + cheapest) * low_ratio
        basis = f"fitted on the CPU corpus (CPU-proxy), {target.threads} thread(s)"
        calibrated = True
        if target.threads != model.device.threads:
            notes.append(f"the corpus was profiled at {model.device.threads} thread(s); predicting for "
                         f"{target.threads} scales by the measured peaks only")
    else:
        compute, slow, fast = roofline_prior(features, target)
        terms = class_terms(features, target)["optimizer"]
        cheapest, dearest = _optimizer_range(features, terms[0] / GPU_EFFICIENCY[2] + terms[2] * GPU_OP_COST[2],
                                             terms[0] / GPU_EFFICIENCY[0] + terms[2] * GPU_OP_COST[0])
        slow, fast = slow + dearest, fast + cheapest
        basis = "physical roofline prior only (not calibrated on this GPU; no GPU was profiled)"
        calibrated = False
    if features.get("optimizer_low", 1.0) < 1.0 or features.get("optimizer_high", 1.0) > 1.0:
        notes.append(f"the optimizer's cost is uncertain (x{features.get('optimizer_low', 1.0):.2g} .. "
                     f"x{features.get('optimizer_high', 1.0):.2g} of the counted step); the interval covers it")
    if features.get("count_complete", 1.0) < 1.0:
        slow, fast = slow * INCOMPLETE_WIDENING, fast / INCOMPLETE_WIDENING
        notes.append("the model could not be fully counted; the interval is widened")
    if compute <= 0:
        raise InsufficientFeatures("the features give a zero step time; they describe no work")
    step = compute + comm
    samples = batch * gpus
    return Prediction(
        samples_per_s=samples / step,
        low=samples / (slow + comm),
        high=samples / max(fast, comm),
        step_seconds=step,
        gpus=gpus,
        device=target.name,
        basis=basis,
        calibrated=calibrated,
        allreduce_seconds=comm,
        notes=tuple(notes),
    )


def roofline_prior(features: Mapping[str, float], device: Device) -> tuple[float, float, float]:
    """(typical, slow, fast) step seconds of the physical prior on ``device``: each class at the slower
    of its FLOP and byte roofline over an achieved fraction of peak (:data:`GPU_EFFICIENCY`) plus its
    ops' launch cost (:data:`GPU_OP_COST`). The fast end also assumes mixed precision, which the
    parameters' dtype cannot show (autocast; and convolutions run in TF32 by default on Ampere and
    later): 32-bit work at the 16-bit tensor peak moving half the bytes."""
    pessimistic, typical, peak = GPU_EFFICIENCY
    slow_ops, typical_ops, fast_ops = GPU_OP_COST
    terms = class_terms(features, device).values()
    roof, launch = sum(t[0] for t in terms), sum(t[2] for t in terms)
    if features.get("dtype_bytes", 4.0) > 2:
        device = replace(device, peak_flops=device.peak_flops_16bit, memory_bandwidth=2 * device.memory_bandwidth)
    fast_roof = sum(t[0] for t in class_terms(features, device).values())
    return (roof / typical + launch * typical_ops, roof / pessimistic + launch * slow_ops,
            fast_roof / peak + launch * fast_ops)


def _optimizer_range(features: Mapping[str, float], fast_seconds: float, slow_seconds: float) -> tuple[float, float]:
    """Seconds to add to the fast and slow ends of the step for an optimizer whose real cost is
    ``optimizer_low`` .. ``optimizer_high`` times the counted one (negative: it may be cheaper)."""
    low, high = features.get("optimizer_low", 1.0), features.get("optimizer_high", 1.0)
    return fast_seconds * (min(low, 1.0) - 1.0), slow_seconds * (max(high, 1.0) - 1.0)


def features_for(zoo_name: str | None = None, model_file: Path | None = None, batch: int | None = None,
                 gpus: int = 1) -> tuple[dict[str, float], str]:
    """Features of a zoo architecture or of the model a Python file builds, and a label for it.

    A model file defines ``build()`` returning ``(model, example_batch)``, optionally followed
    by ``loss_fn`` and an optimizer (a name, a factory or an instance; none given: assumed, interval widened)."""
    from throughput_model.features import describe
    from throughput_model.zoo import classification_loss, zoo_model

    if zoo_name is not None:
        spec = zoo_model(zoo_name)
        size = batch or spec.batches[len(spec.batches) // 2]
        description = describe(spec.make(), spec.batch(size), loss_fn=classification_loss,
                               optimizer=spec.optimizer, gpus=gpus)
        return description.features, f"{spec.name} (batch {size})"
    if model_file is None:
        raise UnknownModel("give a zoo model name or a model file")
    built = _build_from_file(model_file)
    model, example = built[0], built[1]
    loss_fn = built[2] if len(built) > 2 else None
    optimizer = built[3] if len(built) > 3 else None
    description = describe(model, example, loss_fn=loss_fn, optimizer=optimizer, gpus=gpus, batch_size=batch)
    return description.features, f"{model_file.name} ({type(model).__name__}, batch {int(description.features['batch_size'])})"


class _CallableModule(types.ModuleType):
    """This module, callable: ``throughput_model.predict(features, ...)`` is :func:`predict`
    while ``throughput_model.predict.Prediction`` and every ``from throughput_model.predict
    import ...`` keep working."""

    def __call__(self, features: Mapping[str, float], gpus: int = 1, device: str | Device = "cpu",
                 corpus: Path | None = None) -> Prediction:
        return predict(features, gpus=gpus, device=device, corpus=corpus)


sys.modules[__name__].__class__ = _CallableModule


def _build_from_file(path: Path) -> tuple:
    if not path.is_file():
        raise UnknownModel(f"model file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"adloader_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UnknownModel(f"{path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: say what broke
        raise UnknownModel(f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    build = getattr(module, "build", None)
    if not callable(build):
        raise UnknownModel(f"{path} defines no build() returning (model, example_batch)")
    built = build()
    if not isinstance(built, tuple) or len(built) < 2:
        raise UnknownModel(f"{path}: build() must return (model, example_batch[, loss_fn[, optimizer]])")
    return built
