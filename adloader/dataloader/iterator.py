"""One pass over the data, as the training loop sees it: ``__next__`` returns the next batch in order.

Batches come from a *source*: a :class:`~adloader.dataloader.dispatcher.Pool`
of worker processes, or :class:`LocalLoading` (zero workers: the training
thread loads each batch itself when it asks for it, as torch's single-process
loader). Both serve the same epoch table, so a map-style epoch can move from
in-process loading to workers mid-epoch without losing its place.
"""
from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable

from adloader.dataloader.dispatcher import Pool
from adloader.dataloader.errors import WorkerDiedWarning
from adloader.dataloader.fetch import FetchSpec, StreamEnded, fetch_iterable, fetch_map
from adloader.dataloader.seeding import isolated_global_rng, seed_all
from adloader.dataloader.stats import LoaderCounters, ResourceMeter, StepTimer
from adloader.dataloader.table import Batch, Epoch, Outcome


class LocalLoading:
    """The source of an epoch with no workers: every batch is claimed by the training thread."""

    target = 0

    def wait(self, epoch: Epoch, deadline: float | None) -> Outcome | Batch | None:
        outcome = epoch.next_outcome()
        if outcome is not None:
            return outcome
        if epoch.fatal is not None:
            raise epoch.fatal
        if epoch.finished:
            return None
        return epoch.claim_next_locally()

    def consumed(self, epoch: Epoch) -> None:
        epoch.advance()

    def start_epoch(self, epoch: Epoch) -> None:
        pass

    def running(self) -> int:
        return 0

    def worker_pids(self) -> list[int]:
        return []

    def spawner_pid(self) -> int | None:
        return None

    def take_warnings(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


Source = Pool | LocalLoading


class LoaderIterator:
    """The iterator ``iter(loader)`` returns. ``make_pool`` builds a Pool when workers are asked for
    mid-epoch on an epoch that started without any: (the pool, whether this iterator owns it)."""

    def __init__(
        self,
        *,
        epoch: Epoch,
        source: Source,
        owns_source: bool,
        spec: FetchSpec,
        counters: LoaderCounters,
        timer: StepTimer,
        timeout: float,
        length: Callable[[], int],
        pin: Callable[[Any], Any] | None,
        make_pool: Callable[[int], tuple[Pool, bool]],
        rng_snapshot: Any,
        replay_until: int = 0,
        yielded: int = 0,
        reported_length: int | None = None,
    ) -> None:
        self.epoch = epoch
        self.rng_snapshot = rng_snapshot
        self.yielded = yielded
        self._source = source
        self._owns_source = owns_source
        self._spec = spec
        self._counters = counters
        self._timer = timer
        self._timeout = timeout
        self._length = length
        self._pin = pin
        self._make_pool = make_pool
        self.replay_until = replay_until
        self._reported_length = reported_length  # len(loader) of an IterableDataset, if it was asked
        self._stream: Any = None
        self._switch = threading.Lock()
        self._closed = False
        source.start_epoch(epoch)

    # ------------------------------------------------------------ iterator protocol

    def __iter__(self) -> "LoaderIterator":
        return self

    def __len__(self) -> int:
        return self._length()

    def __next__(self) -> Any:
        self._timer.enter()
        try:
            data = self._next_batch()
        except StopIteration:
            self._timer.leave(delivered=False)
            self._finish()
            raise
        except BaseException:
            self._timer.leave(delivered=True)
            raise
        self._timer.leave(delivered=True)
        if self.epoch.iterable and self._reported_length is not None and self.yielded > self._reported_length:
            self._warn_longer_than_reported()
        return data

    def _warn_longer_than_reported(self) -> None:
        """torch's warning, word for word, when an IterableDataset yields more than its ``__len__``."""
        message = (
            f"Length of IterableDataset {self._spec.dataset} was reported to be {self._reported_length}"
            f"(when accessing len(dataloader)), but {self.yielded} samples have been fetched. "
        )
        if self.epoch.streams > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
            )
        warnings.warn(message, stacklevel=3)

    # ------------------------------------------------------------ for the loader

    @property
    def source(self) -> Source:
        return self._source

    @property
    def finished(self) -> bool:
        return self.epoch.finished

    def set_target(self, n: int) -> None:
        """Resize this epoch's workers; an epoch loading in-process hands over to a fresh Pool."""
        with self._switch:
            if isinstance(self._source, LocalLoading):
                if n == 0 or self.epoch.iterable or self._closed or self.epoch.finished:
                    return  # an iterable stream cannot leave the training process mid-epoch
                pool, owned = self._make_pool(n)
                pool.start_epoch(self.epoch)
                self._source, self._owns_source = pool, owned
                return
        self._source.set_target(n)

    def close(self) -> None:
        self._closed = True
        if self._owns_source:
            self._source.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter shutdown)
            pass

    # ------------------------------------------------------------ internals

    def _next_batch(self) -> Any:
        for message in self._source.take_warnings():
            warnings.warn(message, WorkerDiedWarning, stacklevel=3)
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            outcome = self._wait(deadline)
            if outcome is None:
                raise StopIteration
            replayed = self.epoch.next_to_yield < self.replay_until
            self._source.consumed(self.epoch)
            if outcome.skip or replayed:
                continue
            self.yielded += 1
            self._counters.batches += 1
            self._counters.samples += outcome.n_samples
            if outcome.error is not None:
                raise outcome.error
            if outcome.failed:
                outcome.data.reraise()
            return outcome.data

    def _wait(self, deadline: float | None) -> Outcome | None:
        with self._switch:
            source = self._source
        try:
            got = source.wait(self.epoch, deadline)
        except TimeoutError:
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
        if isinstance(got, Batch):
            return self._load_here(got)
        return got

    def _load_here(self, batch: Batch) -> Outcome:
        """Load one batch in the training thread, seeded per batch without disturbing its RNGs."""
        meter = ResourceMeter(scope="thread-self")
        started = time.perf_counter()
        try:
            with isolated_global_rng():
                seed_all(batch.seed)
                if self.epoch.iterable:
                    if self._stream is None:
                        self._stream = iter(self._spec.dataset)
                    data, n_samples = fetch_iterable(self._spec, self._stream, batch.payload)
                else:
                    data, n_samples = fetch_map(self._spec, batch.payload)
            if self._pin is not None:
                data = self._pin(data)
            outcome = Outcome(data=data, n_samples=n_samples)
        except StreamEnded:
            self.epoch.end_streams_at(batch.number)
            outcome = Outcome(skip=True)
        except Exception as exc:  # noqa: BLE001 - raised at this batch, as torch's single-process loader does
            outcome = Outcome(error=exc)
        self._counters.add_usage(meter.delta(time.perf_counter() - started))
        self.epoch.resolve(batch, outcome)
        return outcome

    def _finish(self) -> None:
        if self._owns_source:
            self.close()
