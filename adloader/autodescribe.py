"""Describe a job that never calls ``describe_model``: from its first optimizer step.

Under ``adloader run`` a job's code is not ours to edit, so nobody hands us its model, batch
and optimizer. torch can: a global optimizer step pre-hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``) sees the optimizer at its first
step, and global module forward hooks see every module call before it, with its arguments.
At that first step the model is the outermost module called since start whose parameters are
(at least half, by size) what the optimizer trains and whose call ran its own ``forward``; its
last call's arguments are the example batch. A module with no ``forward`` of its own, or whose
``forward`` was patched on the instance for the call (Lightning's DDP routes ``training_step``
through the wrapper that way, so the arguments are the step's, not the forward's), is passed
over for the modules it calls. The job is then described as ``describe_model`` would (on the meta
device: nothing runs, the job's tensors are never touched), its features announced to the
controller, and the module hooks removed: after the first step the job's forward passes run
hook-free (the optimizer hook stays, a no-op). Where the forward runs inside the step (a
closure, as Lightning's automatic optimization does), the description waits for the next step.

What is not done, so the job is *measured only* (its M comes from its first reports, which is
said once in its output): a model whose parameters no called module holds (a functional
model), a sharded one (FSDP: each rank holds a shard, so no module describes the model), a
call with both positional and keyword arguments, or a description that fails. A job that
called ``describe_model`` itself is left alone. DDP/DataParallel and ``torch.compile``
wrappers are unwrapped to the module they run.

Call :func:`install` once torch is imported (the start-up hook that substitutes the
DataLoader does, when torch first loads); it imports torch, so never before.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from adloader import env, reporter

log = logging.getLogger(__name__)

MIN_COVERED = 0.5
"""Share of the optimizer's parameters (by elements) a module must hold to be taken as the model."""
MAX_STEPS_WAITED = 3
"""Steps to wait for a first module call (a closure runs the forward inside ``optimizer.step``)."""
MAX_CANDIDATES = 4096
"""Module calls remembered until the first step (a loss module, a teacher, the model and the modules
inside each): the newest call of each module, the oldest forgotten first."""
_SHARDED = ("FullyShardedDataParallel", "FSDPModule")
_WRAPPERS = {"DistributedDataParallel": "module", "DataParallel": "module", "OptimizedModule": "_orig_mod"}


@dataclass
class AutoDescriber:
    """The hooks and what they found: ``features`` once described, else ``measured_only`` says why."""

    announce: Callable[[Mapping[str, float]], None]
    world_size: Callable[[], int]
    features: dict[str, float] | None = None
    measured_only: str | None = None
    seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    _calls: dict[int, tuple[int, Any, Any, Any]] = field(default_factory=dict)
    """id(module) -> (nesting depth of the call, weak reference, args, kwargs as meta tensors)."""
    _depth: threading.local = field(default_factory=threading.local)
    _handles: list[Any] = field(default_factory=list)
    """The module hooks, removed at the description."""
    _step_handle: Any = None
    """The optimizer step pre-hook: a no-op once done, and never removed while the job runs (torch
    iterates the hooks while calling it: removing it there would break the job's step)."""
    _steps_waited: int = 0

    def remove(self) -> None:
        """Take the module hooks out (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._calls.clear()

    # ------------------------------------------------------------ hooks

    def _before_forward(self, module: Any, args: Any) -> None:
        self._depth.value = getattr(self._depth, "value", 0) + 1

    def _after_forward(self, module: Any, args: Any, *rest: Any) -> None:
        """(module, args, kwargs, output), or (module, args, output) when forward raised."""
        depth = getattr(self._depth, "value", 1)
        self._depth.value = depth - 1
        if len(rest) != 2 or not _runs_own_forward(module):
            return
        import torch
        from torch.utils._pytree import tree_map

        def meta(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
            return value

        self._calls.pop(id(module), None)
        self._calls[id(module)] = (depth, weakref.ref(module), tree_map(meta, tuple(args)),
                                   tree_map(meta, dict(rest[0])))
        while len(self._calls) > MAX_CANDIDATES:
            self._calls.pop(next(iter(self._calls)))

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.done.is_set():
            return
        if not self._calls and self._steps_waited < MAX_STEPS_WAITED:
            self._steps_waited += 1  # the forward runs inside the step's closure (Lightning): next step
            return
        calls = list(self._calls.values())
        self.remove()
        started = time.perf_counter()
        try:
            self._describe(optimizer, calls)
        except Exception as exc:  # never break the job's training: it is measured instead
            self.measured_only = f"describing the model failed ({type(exc).__name__}: {exc})"
        self.seconds = time.perf_counter() - started
        if self.features is None and self.measured_only is None:
            pass  # the job described itself
        elif self.features is not None:
            log.info("adloader: described the model from the first optimizer step (%s, %.2f s)",
                     type(optimizer).__name__, self.seconds)
            self.announce(self.features)
        else:
            log.warning("adloader: this job is measured only (no prediction of its max throughput): %s",
                        self.measured_only)
        self.done.set()

    def _describe(self, optimizer: Any, calls: list[tuple[int, Any, Any, Any]]) -> None:
        from adloader.describe import was_called

        if was_called():
            self.measured_only = None
            return
        trained = {id(p): p.numel() for group in optimizer.param_groups for p in group["params"]}
        total = sum(trained.values()) or 1
        best, best_rank, best_share, best_call = None, None, 0.0, None
        for depth, ref, call_args, call_kwargs in calls:
            module = _unwrap(ref())
            if module is None or not _runs_own_forward(module):
                continue
            if type(module).__name__ in _SHARDED:
                self.measured_only = f"its model is sharded ({type(module).__name__}): no module holds all of it"
                return
            held = {id(p) for p in module.parameters()}
            share = sum(n for key, n in trained.items() if key in held) / total
            rank = (share < MIN_COVERED, depth, -share)  # covering the optimizer, then outermost, then most
            if best_rank is None or rank < best_rank:
                best, best_rank, best_share, best_call = module, rank, share, (call_args, call_kwargs)
        if best is None or best_share < MIN_COVERED:
            self.measured_only = (f"no module called before the first step holds the optimizer's parameters "
                                  f"(best {best_share:.0%}; a functional model?)")
            return
        call_args, call_kwargs = best_call
        if call_args and call_kwargs:
            self.measured_only = f"{type(best).__name__} was called with positional and keyword arguments"
            return
        from throughput_model.features import describe as count

        description = count(best, call_kwargs if call_kwargs else call_args, optimizer=optimizer,
                            gpus=self.world_size())
        for note in description.notes:
            log.warning("adloader: describing %s: %s", type(best).__name__, note)
        self.features = description.features


def _runs_own_forward(module: Any) -> bool:
    """Whether calling the module runs a ``forward`` its class defines: not ``nn.Module``'s missing one,
    not one patched on the instance (whose arguments need not be the class's forward's)."""
    from torch import nn

    return type(module).forward is not nn.Module.forward and "forward" not in vars(module)


def _unwrap(module: Any) -> Any:
    """The module a data-parallel or compiled wrapper runs (the wrapper itself may sync or recompile)."""
    while module is not None and type(module).__name__ in _WRAPPERS:
        module = getattr(module, _WRAPPERS[type(module).__name__], None)
    return module


_installed: AutoDescriber | None = None


def install(announce: Callable[[Mapping[str, float]], None] | None = None,
            world_size: Callable[[], int] = env.world_size) -> AutoDescriber:
    """Hook torch so the job is described at its first optimizer step (once per process; a second
    call returns the first's describer). ``announce`` defaults to sending the features with the
    job's reports (``adloader.reporter``)."""
    global _installed
    if _installed is not None:
        return _installed
    from torch.nn.modules import module as nn_module
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    describer = AutoDescriber(announce or _announce, world_size)
    describer._handles += [
        nn_module.register_module_forward_pre_hook(describer._before_forward),
        nn_module.register_module_forward_hook(describer._after_forward, with_kwargs=True, always_call=True),
    ]
    describer._step_handle = register_optimizer_step_pre_hook(describer._before_step)
    _installed = describer
    return describer


def uninstall() -> None:
    """Remove the hooks (tests; a job that wants none)."""
    global _installed
    if _installed is not None:
        _installed.remove()
        _installed._step_handle.remove()
    _installed = None


def _announce(features: Mapping[str, float]) -> None:
    if reporter.is_managed():
        reporter.announce_features(features)
