"""Put :class:`adloader.DataLoader` where torch's DataLoader is, the moment torch has imported.

Frameworks bind the name when they import, after torch (``from torch.utils.data import
DataLoader`` in Accelerate, Lightning, transformers, timm), and subclass it (Accelerate's
loaders wrap one, torchdata's ``StatefulDataLoader`` and timm's ``MultiEpochsDataLoader``
subclass it): replacing the two module attributes before any of them imports makes every
one of those adloader's. In this mode a loader adloader cannot run falls back to torch's
own iteration with one warning (see ``adloader.dataloader.loader``) instead of raising.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from adloader.autoload.hooks import when_imported

TORCH_NAMES = ("torch.utils.data", "torch.utils.data.dataloader")
"""The modules whose ``DataLoader`` attribute becomes adloader's."""


def install() -> None:
    """Substitute adloader's loader for torch's in this process as soon as torch is imported."""
    when_imported("torch", _substitute)


def describe_at_first_step() -> None:
    """Describe the job's model at its first optimizer step (adloader.autodescribe), once torch is
    imported: a job under ``adloader run`` never calls ``describe_model`` itself."""
    when_imported("torch", _install_describer)


def _install_describer(_torch: ModuleType) -> None:
    from adloader import autodescribe

    autodescribe.install()


def _substitute(_torch: ModuleType) -> None:
    from adloader.dataloader import loader

    loader.fall_back_when_unsupported()
    for name in TORCH_NAMES:
        setattr(importlib.import_module(name), "DataLoader", loader.DataLoader)
