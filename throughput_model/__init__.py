"""throughput_model: a training job's max throughput from its model's structure.

``throughput_model.predict(features, gpus=..., device=...)`` is the public entry point. The
name is also the module :mod:`throughput_model.predict` (``from throughput_model.predict import
Prediction`` keeps working): that module is callable and calls its :func:`predict`. It is
imported on first use, so ``import throughput_model`` stays cheap (no torch, no scikit-learn).
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["predict"]


def __getattr__(name: str) -> Any:
    if name == "predict":
        return importlib.import_module("throughput_model.predict")
    raise AttributeError(f"module 'throughput_model' has no attribute {name!r}")
