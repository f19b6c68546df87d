"""What each training program of this directory writes, per rank, when it ends: a JSON record.

The programs are what a user writes: none imports adloader. This module is theirs, not
adloader's: it records what the program saw of its own training, so that a test or a
benchmark can compare a run under ``adloader run`` with the same program run plainly.

A record holds: the samples (dataset indices) the rank received in each epoch, in order; the
loss of each of its steps; the class of the loader it iterated (the innermost one: Accelerate's
``DataLoaderShard`` wraps a ``base_dataloader``); the training loop's wall time and sample count
(its throughput), and its pid.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Iterable


def program_arguments(*, samples: bool = True) -> argparse.ArgumentParser:
    """The options every program of this directory takes; a program adds its own before parsing."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="where each rank writes rank<R>.json")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to train (the most, with --stop-file)")
    parser.add_argument("--stop-file", default=None, help="end at the first epoch end where this file exists")
    if samples:
        parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    return parser


def innermost_loader(loader: object) -> object:
    """The loader a framework's wrapper delegates to (``base_dataloader``), else ``loader``."""
    while hasattr(loader, "base_dataloader"):
        loader = loader.base_dataloader
    return loader


def class_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class RankRecord:
    """One rank's record, filled by the training loop, written by :meth:`write`."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.epochs: list[list[int]] = []
        self.losses: list[float] = []
        self.loader_class = ""
        self._started: float | None = None
        self._ended: float | None = None

    def epoch(self) -> None:
        """A new epoch starts: the samples of the next steps count towards it. The first one
        starts the training loop's clock."""
        if self._started is None:
            self._started = time.perf_counter()
        self.epochs.append([])

    def step(self, loader: object, indices: Iterable[int], loss: float) -> None:
        """One training step over the samples ``indices`` from ``loader``, with its loss."""
        self._ended = time.perf_counter()
        self.loader_class = class_name(innermost_loader(loader))
        if not self.epochs:
            self.epoch()
        self.epochs[-1].extend(int(i) for i in indices)
        self.losses.append(float(loss))

    def write(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write ``rank<R>.json`` under ``out_dir``. Wall time runs from the first epoch's start
        to the last step's end: the training loop, the program's start-up excluded."""
        samples = sum(len(e) for e in self.epochs)
        path = Path(out_dir) / f"rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "rank": self.rank, "world_size": self.world_size, "pid": os.getpid(),
            "loader_class": self.loader_class,
            "epochs": self.epochs, "losses": self.losses, "samples": samples,
            "wall_s": (self._ended or 0.0) - (self._started or 0.0),
        }))
        return path


def stop_requested(stop_file: str | None) -> bool:
    """Whether the run should end at this epoch's end: ``--stop-file`` exists."""
    return bool(stop_file) and Path(stop_file).exists()
