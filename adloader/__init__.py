"""adloader: keep a shared GPU node's GPUs busy by moving data-loading resources between jobs.

The in-job library. ``from adloader import DataLoader`` is the one-line change a
training script makes (``adloader run`` makes it for a job that does not). Heavy
imports (torch) happen only when a name that needs them is first used, so
``adloader --help`` and the controller stay light.

``adloader.DataLoader`` is nevertheless a real class from the moment torch has
imported (a post-import hook defines it then, or at once when torch was imported
first): frameworks that patch every subclass of torch's loader (Lightning patches
their ``__init__`` while it builds a loader) find it among them, whenever the
program first names it.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from adloader.autoload.hooks import initializing, when_imported

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


def _define_dataloader(_torch: ModuleType) -> None:
    loader_package = sys.modules.get("adloader.dataloader")
    if loader_package is not None and initializing(loader_package):
        return  # torch imported on the way in (``from adloader import DataLoader`` first): that import defines it
    __getattr__("DataLoader")


when_imported("torch", _define_dataloader)
