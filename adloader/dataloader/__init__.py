"""The resizable DataLoader: ``from adloader import DataLoader``.

Modules, one job each: loader (the public class), iterator (one epoch as the
training loop sees it), dispatcher (the thread that owns the workers), table
(an epoch's batches and reorder buffer), spawner (the helper process workers
are forked from), worker (the worker loop), fetch (building a batch), transfer
(sending it to the training process), seeding (per-batch seeds), stats
(counters and step timing), errors.
"""
from adloader.dataloader.errors import (
    BadLoaderState, BadWorkerCount, IterableWorkerDied, LoaderError, PoisonBatchError, UnsupportedOption,
    WorkerDiedWarning, WorkersCannotStart,
)
from adloader.dataloader.loader import DataLoader

__all__ = [
    "DataLoader", "LoaderError", "PoisonBatchError", "UnsupportedOption", "WorkersCannotStart",
    "IterableWorkerDied", "BadLoaderState", "BadWorkerCount", "WorkerDiedWarning",
]
