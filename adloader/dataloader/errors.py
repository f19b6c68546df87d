"""Errors and warnings of the resizable DataLoader; each message says what happened and what to do."""
from __future__ import annotations

from adloader.errors import AdloaderError


class LoaderError(AdloaderError):
    """Base of the DataLoader's own errors (errors raised by the dataset are re-raised as torch does)."""


class UnsupportedOption(LoaderError, ValueError):
    """A torch DataLoader option this loader does not support (see docs/dataloader.md)."""


class BadWorkerCount(LoaderError, ValueError):
    """set_num_workers() was given something that is not a worker count."""


class PoisonBatchError(LoaderError):
    """One batch killed every worker that tried to load it."""

    def __init__(self, batch: int, indices: object, deaths: int, last_exit: str) -> None:
        super().__init__(
            f"batch {batch} (dataset indices {indices!r}) killed its loader worker {deaths} times "
            f"(last worker {last_exit}); the epoch skips it. Loading those samples crashes the process "
            "(out of memory, or a crash in native code): inspect or exclude those indices."
        )
        self.batch = batch
        self.indices = indices


class WorkersCannotStart(LoaderError):
    """Fresh workers keep dying before they are ready."""


class IterableWorkerDied(LoaderError):
    """A worker streaming an IterableDataset died; its position in the stream cannot be recovered."""


class BadLoaderState(LoaderError, ValueError):
    """load_state_dict() was given a state this loader cannot resume from."""


class TorchLoaderFallback(RuntimeWarning):
    """Under ``adloader run``, a DataLoader adloader cannot run runs as torch's: not resized, not managed."""


class WorkerDiedWarning(RuntimeWarning):
    """A loader worker died; its unfinished batches were given to the other workers."""
