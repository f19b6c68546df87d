"""Keeping adloader's loader under HF Accelerate, whose ``prepare()`` rebuilds every loader.

``accelerator.prepare(loader)`` returns a ``DataLoaderShard`` (or ``DataLoaderDispatcher``) that
wraps a *new* loader of the class Accelerate bound as ``DataLoader`` when it was imported, built
from the old one's dataset and sampler. Under ``adloader run`` that class is adloader's (the
substitution of adloader.autoload happens when torch imports, before Accelerate does), so the
wrapped loader is ours and nothing here is needed: :func:`prepare_data_loader` then returns
``prepare()``'s result unchanged. Where the substitution is off (``adloader run --no-substitute``,
or Accelerate imported in a process not started by ``adloader run``), the wrapped loader is
torch's and an ``adloader.DataLoader`` passed in comes out silently unmanaged: the function puts
an ``adloader.DataLoader`` with the same arguments (Accelerate's sharded batch sampler included)
in place of the wrapped one, so Accelerate's sharding, device placement and RNG sync work as
before and the loader is ours again.
"""
from __future__ import annotations

import warnings
from typing import Any

from adloader.dataloader.loader import DataLoader

_COPIED = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "persistent_workers", "pin_memory_device",
)


def prepare_data_loader(accelerator: Any, loader: DataLoader) -> Any:
    """``accelerator.prepare(loader)``, keeping ``loader`` an adloader.DataLoader inside Accelerate's wrapper."""
    prepared = accelerator.prepare(loader)
    inner = getattr(prepared, "base_dataloader", None)
    if inner is None or isinstance(inner, DataLoader):
        return prepared
    if type(inner).__name__ == "StatefulDataLoader":
        warnings.warn(
            "adloader: Accelerate was asked for torchdata's StatefulDataLoader (use_stateful_dataloader=True); "
            "that loader is kept, so this job's loader is not resized by adloader", stacklevel=2,
        )
        return prepared
    kwargs = {name: getattr(inner, name) for name in _COPIED}
    kwargs["num_workers"] = loader.num_workers  # the count adloader may have changed since
    kwargs["prefetch_factor"] = inner.prefetch_factor
    if inner.batch_sampler is not None:
        kwargs["batch_sampler"] = inner.batch_sampler
    else:
        kwargs.update(batch_size=None, sampler=inner.sampler, drop_last=inner.drop_last)
    prepared.base_dataloader = DataLoader(inner.dataset, **kwargs)
    loader.close()  # the original one will not be iterated: no workers left behind
    return prepared
