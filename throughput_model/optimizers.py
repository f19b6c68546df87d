"""Which optimizer step to count, from whatever the job says it trains with.

A job may name its optimizer ("sgd", "AdamW", "rmsprop"), hand over a factory
(``params -> Optimizer``, an optimizer class included), hand over the optimizer instance it
trains with, or say nothing. :func:`resolve` turns each into an :class:`OptimizerPlan`: how to
build the optimizer whose step :func:`throughput_model.features.describe` replays on meta
tensors, and how far the real step's cost may lie from the counted one (``cost_range``:
multipliers of the counted optimizer time, carried in the features as ``optimizer_low`` and
``optimizer_high``, which widen the prediction's interval).

- A name, a factory, or an instance of one of torch's own optimizers: replayed exactly,
  with the instance's param groups and every option that changes its cost (momentum, betas,
  weight decay, amsgrad, foreach). ``fused=True`` cannot run on meta tensors: its single-tensor
  form is replayed and its traffic set to what one fused kernel per tensor moves.
- Nothing given: AdamW is counted, said once per process, and the interval spans the
  optimizers it could be (plain SGD to Adam/AdamW).
- A subclass of a torch optimizer: its torch base is replayed with the instance's options,
  the interval widened (its own ``step`` may do more or less).
- Any other ``Optimizer``: estimated from the state it already holds (tensors per parameter),
  else from an AdamW-sized step with the widest interval. Never an error for a valid optimizer.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from throughput_model.errors import ThroughputModelError

log = logging.getLogger(__name__)

Factory = Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
OptimizerSpec = torch.optim.Optimizer | str | Factory | None

NAMED: dict[str, Factory | None] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd-plain": lambda params: torch.optim.SGD(params, lr=0.1),
    "none": None,
}
"""The names the corpus was profiled with (its records keep them); any other name of a
``torch.optim`` class ("RMSprop", "adagrad") is that class with its default options."""

FALLBACK_COST: dict[str, tuple[float, float]] = {
    "sgd": (5.0, 3.0), "sgd-plain": (3.0, 1.0), "adam": (10.0, 10.0), "adamw": (10.0, 11.0), "none": (0.0, 0.0),
}
"""Optimizer traffic per parameter byte and ops per parameter tensor, used only when the
optimizer step cannot be replayed (single-tensor implementations, as on CPU)."""

ASSUMED = "adamw"
CANDIDATES = ("sgd-plain", "sgd", "adam", "adamw")
"""What an optimizer nobody named could be: the interval spans their costs."""
SUBCLASS_RANGE = (0.5, 2.0)
"""A subclass of a torch optimizer: its base's step, give or take its own additions."""
STATE_RANGE = (0.5, 2.0)
"""An unknown optimizer estimated from the state tensors it holds per parameter."""
UNKNOWN_RANGE = (0.0, 3.0)
"""An unknown optimizer with nothing to go on: from free to three AdamW steps (factored and
second-order optimizers), around an AdamW-sized estimate."""

_said: set[str] = set()


class UnknownOptimizer(ThroughputModelError, ValueError):
    """A name that is neither a known optimizer name nor a ``torch.optim`` class."""


@dataclass(frozen=True)
class OptimizerPlan:
    """How to build the optimizer to replay on meta parameters, and how sure its cost is."""

    label: str
    build: Callable[[Mapping[int, torch.Tensor], list[torch.Tensor]], torch.optim.Optimizer] | None
    """(meta parameter by id of the real one, trainable meta parameters) -> optimizer; None: no step."""
    fallback: str
    """Key of :data:`FALLBACK_COST` used if the step cannot be replayed."""
    cost_range: tuple[float, float] = (1.0, 1.0)
    fused: bool = False
    """Counted unfused; its traffic is to be set to one fused kernel's (:func:`fused_traffic`)."""
    note: str | None = None
    state_tensors: int | None = None
    """For an optimizer estimated from its state: state tensors per parameter."""


def resolve(optimizer: OptimizerSpec) -> OptimizerPlan:
    """The plan for ``optimizer`` (see the module docstring); :class:`UnknownOptimizer` for a bad name."""
    if optimizer is None:
        return _assumed()
    if isinstance(optimizer, torch.optim.Optimizer):
        return _from_instance(optimizer)
    if isinstance(optimizer, str):
        return _from_name(optimizer)
    if callable(optimizer):
        label = getattr(optimizer, "__name__", type(optimizer).__name__)
        return OptimizerPlan(label, lambda _ids, trainable: optimizer(trainable), _family_of_name(label))
    raise UnknownOptimizer(f"optimizer {optimizer!r} is not an Optimizer, a factory or a name; "
                           f"pass the optimizer the job trains with")


def say_once(message: str) -> None:
    """Log ``message`` as a warning the first time this process sees it."""
    if message not in _said:
        _said.add(message)
        log.warning("%s", message)


def fused_traffic(param_bytes: float, tensors: int, state_tensors: int) -> tuple[float, float]:
    """(bytes, ops) of a fused step: each parameter, its gradient and every state tensor read once,
    the parameter and state written once; one kernel per parameter tensor."""
    return param_bytes * (3.0 + 2.0 * state_tensors), float(tensors)


def state_tensors_per_param(optimizer: torch.optim.Optimizer) -> int | None:
    """Parameter-sized state tensors per parameter (0 plain SGD, 1 momentum, 2 Adam), from an
    optimizer that has stepped; None when it holds no state yet."""
    counts = []
    for param, state in optimizer.state.items():
        if isinstance(param, torch.Tensor) and isinstance(state, Mapping):
            counts.append(sum(1 for v in state.values()
                              if isinstance(v, torch.Tensor) and v.numel() == param.numel() and v.numel() > 1))
    return max(counts) if counts else None


def _assumed() -> OptimizerPlan:
    assumed_cost, low, high = FALLBACK_COST[ASSUMED], float("inf"), 0.0
    for name in CANDIDATES:
        cost = FALLBACK_COST[name]
        ratios = [c / a for c, a in zip(cost, assumed_cost)]
        low, high = min(low, *ratios), max(high, *ratios)
    return OptimizerPlan(ASSUMED, lambda _ids, trainable: NAMED[ASSUMED](trainable), ASSUMED, (low, high),
                         note=f"no optimizer given: counted AdamW; the interval spans {', '.join(CANDIDATES)} "
                              "(pass optimizer= the optimizer the job trains with to narrow it)")


def _from_name(name: str) -> OptimizerPlan:
    key = name.strip().lower()
    if key in NAMED:
        factory = NAMED[key]
        return OptimizerPlan(key, None if factory is None else (lambda _ids, trainable: factory(trainable)), key)
    classes = _torch_classes()
    if key not in classes:
        raise UnknownOptimizer(f"unknown optimizer {name!r}; use one of {sorted(NAMED)}, a torch.optim class name "
                               f"({', '.join(sorted(c.__name__ for c in classes.values()))}), a factory or the "
                               "optimizer itself")
    cls = classes[key]
    return OptimizerPlan(cls.__name__, lambda _ids, trainable: cls(trainable), _family_of_name(key))


def _from_instance(optimizer: torch.optim.Optimizer) -> OptimizerPlan:
    cls = type(optimizer)
    label = cls.__name__
    torch_classes = set(_torch_classes().values())
    if cls in torch_classes:
        fused = bool(optimizer.defaults.get("fused")) or any(g.get("fused") for g in optimizer.param_groups)
        return OptimizerPlan(label, _rebuild(optimizer, cls), _family_of_name(label), fused=fused,
                             state_tensors=state_tensors_per_param(optimizer))
    base = next((c for c in cls.__mro__[1:] if c in torch_classes), None)
    if base is not None:
        return OptimizerPlan(label, _rebuild(optimizer, base), _family_of_name(base.__name__), SUBCLASS_RANGE,
                             note=f"optimizer {label} is not one of torch's: counted as its base {base.__name__}, "
                                  f"interval widened x{SUBCLASS_RANGE[0]:g}..x{SUBCLASS_RANGE[1]:g} "
                                  "on the optimizer step")
    states = state_tensors_per_param(optimizer)
    if states is not None:
        return OptimizerPlan(label, None, ASSUMED, STATE_RANGE, state_tensors=states,
                             note=f"optimizer {label} is unknown: its cost estimated from the {states} state tensor(s) "
                                  f"it holds per parameter, interval widened on the optimizer step")
    return OptimizerPlan(label, None, ASSUMED, UNKNOWN_RANGE,
                         note=f"optimizer {label} is unknown and holds no state yet: estimated as an AdamW-sized step, "
                              f"interval x{UNKNOWN_RANGE[0]:g}..x{UNKNOWN_RANGE[1]:g} on the optimizer step")


def _rebuild(optimizer: torch.optim.Optimizer,
             cls: type[torch.optim.Optimizer]) -> Callable[..., torch.optim.Optimizer]:
    """A builder of ``cls`` over the meta twins of ``optimizer``'s param groups, with each group's options
    (only those ``cls`` accepts; ``fused`` replaced by the single-tensor form, which meta tensors can run)."""
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}

    def options(group: Mapping[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in group.items() if k in accepted and k != "params"}
        if kept.get("fused"):
            kept.update(fused=False, foreach=False)
        return kept

    def build(meta_by_id: Mapping[int, torch.Tensor], _trainable: list[torch.Tensor]) -> torch.optim.Optimizer:
        groups = []
        for group in optimizer.param_groups:
            params = [meta_by_id[id(p)] for p in group["params"]
                      if id(p) in meta_by_id and meta_by_id[id(p)].requires_grad]
            if params:
                groups.append({"params": params, **options(group)})
        if not groups:
            raise ThroughputModelError("the optimizer holds none of the model's trainable parameters")
        return cls(groups, **options(optimizer.defaults))

    return build


def _family_of_name(name: str) -> str:
    """The :data:`FALLBACK_COST` entry closest to an optimizer called ``name``."""
    lowered = name.lower()
    for key in ("adamw", "adam", "sgd"):
        if key in lowered:
            return key
    return ASSUMED


def _torch_classes() -> dict[str, type[torch.optim.Optimizer]]:
    """torch's own optimizer classes by lower-case name."""
    return {name.lower(): obj for name, obj in vars(torch.optim).items()
            if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer}
