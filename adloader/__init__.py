"""adloader: keep a shared GPU node's GPUs busy by moving data-loading resources between jobs.

The in-job library. ``from adloader import DataLoader`` is the one-line change a
training script makes. Heavy imports (torch) happen only when a name that needs
them is first used, so ``adloader --help`` and the controller stay light.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "DataLoader": ("adloader.dataloader", "DataLoader"),
    "describe_model": ("adloader.describe", "describe_model"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'adloader' has no attribute {name!r}")
