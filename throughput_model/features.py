"""A model's features, from its structure alone: nothing runs on a GPU or touches real data.

:func:`describe` replays one training step (forward, backward, optimizer step) on the
meta device through ``torch.func.functional_call`` with meta copies of the parameters,
so the caller's model is neither copied nor changed, and counts every operator with
:mod:`throughput_model.counting`. The result is a flat ``dict[str, float]`` (it travels
in ``protocol.Register.features``) of at most :data:`MAX_KEYS` keys.

A step that fails on meta tensors (``.item()``, data-dependent shapes, tensors made on a
fixed device) is replayed once on CPU tensors of constant values, for a model of up to
:data:`REPLAY_MAX_BYTES`. One that still fails, or is larger, is replayed on the meta device
with each read of a value answered by the same constants. What still cannot be counted is
said, never guessed silently: it is estimated from what was counted (backward = 2x forward;
optimizer from the parameter bytes), ``count_complete`` drops to 0 and the reason is in
:attr:`Description.notes`.
"""
from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from throughput_model.counting import (
    COMPUTE_CLASSES,
    FUSED_CLASSES,
    LOWERED_CLASSES,
    OP_CLASSES,
    PHASES,
    AccountedStep,
    StepTally,
    account_step,
    tensor_bytes,
)
from throughput_model.optimizers import FALLBACK_COST, NAMED, OptimizerPlan, OptimizerSpec, fused_traffic, resolve, \
    say_once, state_tensors_per_param

OPTIMIZERS = NAMED
"""The optimizer names the corpus was profiled with (see :mod:`throughput_model.optimizers`)."""

GLOBAL_KEYS: tuple[str, ...] = (
    "batch_size", "gpus", "params", "param_bytes", "grad_bytes", "param_tensors", "dtype_bytes",
    "activation_bytes", "flops_forward", "flops_backward", "ops_total", "allreduce_bytes", "count_complete",
    "optimizer_low", "optimizer_high",
)
"""``optimizer_low``/``optimizer_high``: how far the real optimizer step's time may lie from the
counted one, as multipliers (1, 1 when the optimizer the job trains with was counted)."""
CLASS_KEYS: tuple[str, ...] = tuple(
    f"{c}_{q}" for c in OP_CLASSES
    for q in (("flops",) if c in COMPUTE_CLASSES else ()) + ("bytes", "ops") + (() if c in FUSED_CLASSES else ("alloc",))
)
"""Per class: FLOPs (compute classes), bytes, ops, and large allocations (not for fused regions,
whose meta-device decomposition allocates buffers the fused kernel does not)."""
LOWERED_KEYS: tuple[str, ...] = tuple(f"{c}_lowered" for c in LOWERED_CLASSES)
"""Column-buffer bytes of the classes a CPU may run GEMM-lowered (see :func:`counting.lowered_bytes`)."""
FEATURE_KEYS: tuple[str, ...] = GLOBAL_KEYS + CLASS_KEYS + LOWERED_KEYS
MAX_KEYS = 64
assert len(FEATURE_KEYS) <= MAX_KEYS


@dataclass(frozen=True)
class Description:
    """Features plus what could not be counted and how long counting took."""

    features: dict[str, float]
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    unformulated_ops: tuple[str, ...] = field(default_factory=tuple)


def allreduce_bytes(grad_bytes: float, gpus: int) -> float:
    """Bytes each GPU sends in a ring all-reduce of the gradients: 2(g-1)/g x gradient bytes."""
    return 2.0 * (gpus - 1) / gpus * grad_bytes if gpus > 1 else 0.0


def describe(
    model: nn.Module,
    example_batch: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: OptimizerSpec = None,
    gpus: int = 1,
    batch_size: int | None = None,
) -> Description:
    """Count one training step of ``model`` on ``example_batch`` without running it.

    ``example_batch`` is what the model is called with: a tensor (``model(x)``), a tuple or
    list (``model(*batch)``) or a dict (``model(**batch)``). ``loss_fn(output)`` makes the
    scalar loss (default: the sum of the floating outputs, which costs about what a real loss
    costs except for very large classifier heads). ``optimizer`` is the ``torch.optim.Optimizer`` the
    job trains with (its param groups and options are counted), a factory ``params -> Optimizer``, a
    name ("sgd": momentum 0.9, "sgd-plain": none, what sparse embedding gradients train with, "adam",
    "adamw", "none", or any ``torch.optim`` class name), or None: AdamW is counted, said once, and the
    interval covers the optimizers it could be (:mod:`throughput_model.optimizers`). Call it
    before training starts, not while another thread trains the same model: the parameters are
    swapped for meta tensors during the call.
    """
    started = time.perf_counter()
    notes: list[str] = []
    plan = resolve(optimizer)
    if plan.note is not None:
        say_once(f"describe_model: {plan.note}")
    loss_of = loss_fn or _sum_of_outputs
    step = _count_step(model, example_batch, plan, loss_of, _meta, notes)
    if step.result.failed_phase in ("forward", "backward"):
        step = _replayed_on_stand_ins(model, example_batch, plan, loss_of, step, notes)
    if step.result.failed_phase in ("forward", "backward"):
        step = _replayed_with_constant_reads(model, example_batch, plan, loss_of, step, notes)
    params, trainable, result, opt = step.params, step.trainable, step.result, step.optimizer
    size = batch_size if batch_size is not None else _batch_size(example_batch)
    tally = result.tally
    complete = result.failed_phase is None
    if not complete:
        notes.append(f"could not count the {result.failed_phase} phase on the meta device ({result.error}); "
                     "estimated it from the phases that were counted")
        _estimate_missing(tally, result.failed_phase, trainable, plan.fallback, notes)
    elif trainable and opt is None and plan.fallback != "none":  # not replayed: known by its state or kind only
        _estimate_optimizer(tally, trainable, plan)
    elif opt is not None and plan.fused:
        _set_fused_traffic(tally, trainable, state_tensors_per_param(opt) or 0)
    if tally.ops_without_formula:
        notes.append(f"{tally.ops_without_formula} matmul/conv ops had no FLOP formula "
                     f"({', '.join(sorted(tally.unformulated))}); their FLOPs count as zero")
        complete = False
    param_bytes = float(sum(tensor_bytes(p) for p in {id(p): p for p in params.values()}.values()))
    grad_bytes = float(sum(tensor_bytes(p) for p in trainable))
    features = {
        "batch_size": float(size),
        "gpus": float(gpus),
        "params": float(sum(p.numel() for p in {id(p): p for p in params.values()}.values())),
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "param_tensors": float(len(trainable)),
        "dtype_bytes": float(trainable[0].element_size()) if trainable else 4.0,
        "activation_bytes": tally.forward_output_bytes,
        "flops_forward": tally.phase_flops["forward"],
        "flops_backward": tally.phase_flops["backward"],
        "ops_total": float(tally.ops),
        "allreduce_bytes": allreduce_bytes(grad_bytes, gpus),
        "count_complete": 1.0 if complete else 0.0,
        "optimizer_low": plan.cost_range[0],
        "optimizer_high": plan.cost_range[1],
    }
    for cls, counts in tally.classes.items():
        if cls in COMPUTE_CLASSES:
            features[f"{cls}_flops"] = counts.flops
        features[f"{cls}_bytes"] = counts.bytes
        features[f"{cls}_ops"] = float(counts.ops)
        if cls not in FUSED_CLASSES:
            features[f"{cls}_alloc"] = counts.alloc
        if cls in LOWERED_CLASSES:
            features[f"{cls}_lowered"] = counts.lowered
    return Description(features, tuple(notes), time.perf_counter() - started, tuple(sorted(tally.unformulated)))


REPLAY_MAX_BYTES = 256 * 2**20
"""Largest model (parameter and buffer bytes) whose step is replayed on CPU stand-ins when the
meta device cannot run it: the replay computes for real, once, on the CPU."""


@dataclass
class _CountedStep:
    """One replayed step: the twins it ran on, what it counted, and the optimizer it stepped."""

    params: dict[str, torch.Tensor]
    trainable: list[torch.Tensor]
    result: AccountedStep
    optimizer: torch.optim.Optimizer | None


def _count_step(model: nn.Module, example_batch: Any, plan: OptimizerPlan, loss_of: Callable[[Any], torch.Tensor],
                twin: Callable[[torch.Tensor, bool], torch.Tensor], notes: list[str]) -> _CountedStep:
    """One training step of ``model`` replayed through ``torch.func.functional_call`` on ``twin``s of
    its parameters, buffers and batch (the model itself is neither copied nor changed), counted."""
    twins: dict[int, torch.Tensor] = {}  # one twin per real tensor: tied weights stay tied (and count once)
    params = {n: twins.setdefault(id(p), twin(p, p.requires_grad))
              for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: twins.setdefault(id(b), twin(b, False)) for n, b in model.named_buffers(remove_duplicate=False)}
    trainable = [p for p in {id(p): p for p in params.values()}.values() if p.requires_grad]
    twin_by_id = {id(p): params[n] for n, p in model.named_parameters(remove_duplicate=False)}
    batch = tree_map(lambda t: twin(t, False) if isinstance(t, torch.Tensor) else t, example_batch)
    opt = _build_optimizer(plan, twin_by_id, trainable, notes)
    step = _hook_free_step(opt) if opt is not None else None

    def forward() -> torch.Tensor:
        args, kwargs = _call_arguments(batch)
        return loss_of(torch.func.functional_call(model, (params, buffers), args, kwargs, strict=False))

    if step is not None:
        _prime_optimizer_state(trainable, step, notes)
    return _CountedStep(params, trainable, account_step(forward, step), opt)


def _replayed_on_stand_ins(model: nn.Module, example_batch: Any, plan: OptimizerPlan,
                           loss_of: Callable[[Any], torch.Tensor], on_meta: _CountedStep,
                           notes: list[str]) -> _CountedStep:
    """A step the meta device cannot run (the model reads a value: ``.item()``, a data-dependent
    shape, a tensor made on a fixed device) replayed on real CPU tensors of constant values, when
    the model is small enough (:data:`REPLAY_MAX_BYTES`); else the meta count, to be estimated."""
    size = sum(tensor_bytes(t) for t in itertools.chain(model.parameters(), model.buffers()))
    if size > REPLAY_MAX_BYTES:
        notes.append(f"the model ({size / 2**20:.0f} MiB) is too large to replay its step on CPU stand-ins")
        return on_meta
    replay_notes: list[str] = []
    replayed = _count_step(model, example_batch, plan, loss_of, _stand_in, replay_notes)
    if replayed.result.failed_phase is not None:
        notes.append(f"the step failed on CPU stand-ins too ({replayed.result.error})")
        return on_meta
    notes.extend([f"the {on_meta.result.failed_phase} phase failed on the meta device ({on_meta.result.error}): "
                  "counted on CPU stand-ins (constant values) instead", *replay_notes])
    return replayed


def _replayed_with_constant_reads(model: nn.Module, example_batch: Any, plan: OptimizerPlan,
                                  loss_of: Callable[[Any], torch.Tensor], counted: _CountedStep,
                                  notes: list[str]) -> _CountedStep:
    """A step neither the meta device nor the stand-ins could run, replayed on the meta device
    with every read of a value answered by a stand-in's constant (:class:`_ConstantReads`): a
    model too large to replay for real, or one that rejects constant data. Kept when it counts
    further than ``counted`` did; a data-dependent shape (``nonzero``) still stops it."""
    replay_notes: list[str] = []
    with _ConstantReads():
        replayed = _count_step(model, example_batch, plan, loss_of, _meta, replay_notes)
    failed = replayed.result.failed_phase
    if _phases_counted(failed) <= _phases_counted(counted.result.failed_phase):
        notes.append(f"the step failed with constant value reads on the meta device too ({replayed.result.error})")
        return counted
    notes.extend([f"the {counted.result.failed_phase} phase read tensor values: counted on the meta device, "
                  "each read answered by a constant (1 for integers and booleans, 0.01 otherwise)", *replay_notes])
    return replayed


def _phases_counted(failed_phase: str | None) -> int:
    """How many phases a step counted before ``failed_phase`` (None: the whole step)."""
    return len(PHASES) if failed_phase is None else PHASES.index(failed_phase)


class _ConstantReads(TorchDispatchMode):
    """Answers a read of a meta tensor's value (``.item()``, ``bool(t)``, ``int(t)``) with the constant a
    CPU stand-in holds (:func:`_stand_in`), so that a step which branches on a value can be counted
    without the memory or the data a real replay needs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            constant = _constant_for(args[0])
            return bool(constant) if args[0].dtype == torch.bool else constant
        return func(*args, **(kwargs or {}))


def _stand_in(tensor: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A CPU tensor of ``tensor``'s shape and dtype holding a harmless constant: 0.01 for floating
    point (a weight, an activation), 1 for integers and booleans (a valid token id, an open mask)."""
    stand_in = torch.full(tensor.shape, _constant_for(tensor), dtype=tensor.dtype)
    return stand_in.requires_grad_(requires_grad and _differentiable(tensor))


def _constant_for(tensor: torch.Tensor) -> float | int:
    """The harmless constant a stand-in of ``tensor`` holds, and a read of its value returns."""
    return 0.01 if _differentiable(tensor) else 1


def _meta(tensor: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
    return meta.requires_grad_(requires_grad and _differentiable(tensor))


def _differentiable(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def _batch_size(batch: Any) -> int:
    for leaf in tree_flatten(batch)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 1


def _call_arguments(batch: Any) -> tuple[tuple, dict]:
    if isinstance(batch, dict):
        return (), batch
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def _sum_of_outputs(output: Any) -> torch.Tensor:
    floats = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        raise TypeError("the model returned no floating-point tensor to take a loss of; pass loss_fn")
    total = floats[0].sum()
    for tensor in floats[1:]:
        total = total + tensor.sum()
    return total


def _build_optimizer(plan: OptimizerPlan, twin_by_id: dict[int, torch.Tensor], trainable: list[torch.Tensor],
                     notes: list[str]) -> torch.optim.Optimizer | None:
    """The optimizer of ``plan`` over the twin parameters, or None (no optimizer, or it cannot be built there)."""
    if plan.build is None or not trainable:
        return None
    try:
        return plan.build(twin_by_id, trainable)
    except Exception as exc:  # the job's own optimizer class: estimate its step instead
        notes.append(f"optimizer {plan.label} could not be built on the meta device ({type(exc).__name__}: {exc}); "
                     "its step is estimated from the parameter sizes")
        return None


def _hook_free_step(optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """The meta optimizer's step without torch's step hooks: the job's global optimizer hooks (a step
    counter, ``adloader.autodescribe``) must not see the steps this count replays."""
    step = getattr(type(optimizer).step, "__wrapped__", None)  # Optimizer.profile_hook_step keeps the original
    return functools.partial(step, optimizer) if callable(step) else optimizer.step


def _estimate_optimizer(tally: StepTally, trainable: list[torch.Tensor], plan: OptimizerPlan) -> None:
    """An optimizer step that was not replayed: from the state tensors it holds per parameter, else its family's."""
    param_bytes = float(sum(tensor_bytes(p) for p in trainable))
    if plan.state_tensors is not None:
        per_byte, per_tensor = FALLBACK_COST[("sgd-plain", "sgd", "adam")[min(plan.state_tensors, 2)]]
        scale = max(1.0, plan.state_tensors / 2.0)
        per_byte, per_tensor = per_byte * scale, per_tensor * scale
    else:
        per_byte, per_tensor = FALLBACK_COST[plan.fallback]
    _set_optimizer(tally, per_byte * param_bytes, per_tensor * len(trainable))


def _set_fused_traffic(tally: StepTally, trainable: list[torch.Tensor], state_tensors: int) -> None:
    """A fused step was counted in its single-tensor form: its traffic is one kernel's per tensor."""
    _set_optimizer(tally, *fused_traffic(float(sum(tensor_bytes(p) for p in trainable)), len(trainable), state_tensors))


def _set_optimizer(tally: StepTally, optimizer_bytes: float, ops: float) -> None:
    counts = tally.classes["optimizer"]
    counts.bytes, counts.ops = optimizer_bytes, ops
    tally.phase_bytes["optimizer"] = optimizer_bytes


def _prime_optimizer_state(trainable: list[torch.Tensor], step: Callable[[], Any], notes: list[str]) -> None:
    """Take one uncounted optimizer step so the counted one is a steady-state step (state buffers exist)."""
    for p in trainable:
        p.grad = torch.zeros_like(p)
    try:
        step()
    except Exception as exc:  # the counted step will fail the same way and be estimated
        notes.append(f"optimizer state could not be created on the meta device ({type(exc).__name__})")
    for p in trainable:
        p.grad = None


def _estimate_missing(tally: StepTally, failed: str | None, trainable: list[torch.Tensor], optimizer: str,
                      notes: list[str]) -> None:
    """Fill the phases a failure left uncounted from the ones that were counted."""
    if failed == "forward":  # account_step kept nothing of it
        notes.append("nothing could be counted: features hold only parameter sizes; the model is not "
                     "predicted, and a job training it is measured only")
        return
    if failed == "backward":
        for counts in tally.classes.values():
            if counts.ops and counts is not tally.classes["optimizer"]:
                counts.flops *= 3.0
                counts.bytes *= 3.0
                counts.ops *= 2
        tally.phase_flops["backward"] = 2.0 * tally.phase_flops["forward"]
        tally.phase_bytes["backward"] = 2.0 * tally.phase_bytes["forward"]
    if failed in ("backward", "optimizer"):
        per_byte, per_tensor = FALLBACK_COST.get(optimizer, FALLBACK_COST["adamw"])
        counts = tally.classes["optimizer"]
        counts.bytes = per_byte * float(sum(tensor_bytes(p) for p in trainable))
        counts.ops = per_tensor * len(trainable)
        tally.phase_bytes["optimizer"] = counts.bytes
