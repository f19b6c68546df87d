"""The resizable DataLoader: ``from adloader import DataLoader``.

Modules, one job each: loader (the public class), iterator (one epoch as the
training loop sees it), dispatcher (the thread and the Pool that composes the
next four), workers (worker processes: start, retire, stop, forget), credits
(which worker loads which batch), receiver (rebuilding, pinning and settling
results), deaths (what a worker's death does to the epoch), table (an epoch's
batches and reorder buffer), spawner (the helper process workers are forked
from), worker (the worker loop), messages (typed messages), handoff (a
worker's own pickle under spawn), fetch (building a batch), transfer (sending
it to the training process), seeding (per-batch seeds), stats (counters, step
timing, resize latencies), errors.
"""
from adloader.dataloader.errors import (
    BadLoaderState, BadWorkerCount, IterableWorkerDied, LoaderError, PoisonBatchError, UnsupportedOption,
    WorkerDiedWarning, WorkersCannotStart,
)
from adloader.dataloader.loader import DataLoader

__all__ = [
    "DataLoader", "LoaderError", "PoisonBatchError", "UnsupportedOption", "WorkersCannotStart",
    "IterableWorkerDied", "BadLoaderState", "BadWorkerCount", "WorkerDiedWarning", "TorchLoaderFallback",
]
