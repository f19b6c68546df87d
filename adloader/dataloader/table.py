"""One epoch's table: batch number -> indices -> state, plus the reorder buffer.

Batches are numbered in the sampler's order as they are pulled. A batch is
PENDING (pulled, not at any worker), INFLIGHT (sent to one worker) or DONE
(its outcome waits in the reorder buffer until the training loop asks for
it). A batch whose worker dies or retires goes back to PENDING and is sent
again; the lowest pending number always goes first, so the training loop is
never kept waiting behind newer work. Nothing here does I/O or takes locks:
the owner (the dispatcher, or the training thread when loading in-process)
serialises access.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterator

from adloader.dataloader.seeding import batch_seed

PENDING, INFLIGHT, DONE = "pending", "inflight", "done"


@dataclass
class Batch:
    number: int
    payload: Any  # map-style: the sampler's indices; iterable: the batch size (None without batching)
    seed: int
    state: str = PENDING
    worker: int | None = None  # token of the worker it is in flight at
    deaths: int = 0  # workers that died while loading it


@dataclass
class Outcome:
    """What the training loop gets for one batch number."""

    data: Any = None
    n_samples: int = 0
    failed: bool = False  # ``data`` is a torch ExceptionWrapper from the worker
    skip: bool = False  # an iterable stream ended at this task: nothing to deliver
    error: BaseException | None = None  # our own error to raise at this batch (e.g. poison)


@dataclass
class Epoch:
    """The table of one pass over the data.

    ``source`` yields map-style payloads (index lists). Iterable datasets have
    no source: every task asks a worker for its next ``batch_size`` items, and
    the epoch ends when every stream has ended."""

    number: int
    base_seed: int
    source: Iterator[Any] | None
    iterable_batch_size: int | None = None
    streams: int = 0  # iterable only: workers streaming this epoch (0: in-process)
    pulled: int = 0
    exhausted: bool = False
    end: int | None = None  # total number of batch numbers once known
    next_to_yield: int = 0
    fatal: BaseException | None = None
    batches: dict[int, Batch] = field(default_factory=dict)
    done: dict[int, Outcome] = field(default_factory=dict)
    ended_streams: set[int] = field(default_factory=set)
    _pending: list[int] = field(default_factory=list)

    @property
    def iterable(self) -> bool:
        return self.source is None

    def pull(self) -> Batch | None:
        """Take the next payload from the sampler (map) or make the next task (iterable)."""
        if self.exhausted:
            return None
        if self.source is None:
            payload = self.iterable_batch_size
        else:
            try:
                payload = next(self.source)
            except StopIteration:
                self.exhausted = True
                self.end = self.pulled
                return None
        batch = Batch(self.pulled, payload, batch_seed(self.base_seed, self.number, self.pulled))
        self.batches[batch.number] = batch
        self.pulled += 1
        return batch

    def take(self, limit: int) -> Batch | None:
        """The next batch to send, lowest number first, only below ``limit`` (the prefetch window)."""
        while self._pending:
            number = self._pending[0]
            batch = self.batches.get(number)
            if batch is None or batch.state != PENDING:
                heapq.heappop(self._pending)  # stale entry: claimed in-process meanwhile
                continue
            if number >= limit:
                return None
            heapq.heappop(self._pending)
            return batch
        if self.pulled >= limit:
            return None
        return self.pull()

    def requeue(self, batch: Batch) -> None:
        batch.state, batch.worker = PENDING, None
        heapq.heappush(self._pending, batch.number)

    def claim_next_locally(self) -> Batch | None:
        """The batch the training loop waits for, if no worker holds it (in-process loading)."""
        number = self.next_to_yield
        batch = self.batches.get(number)
        if batch is None and number == self.pulled:
            batch = self.pull()
        if batch is None or batch.state != PENDING:
            return None
        batch.state = INFLIGHT
        return batch

    def resolve(self, batch: Batch, outcome: Outcome) -> None:
        batch.state, batch.worker = DONE, None
        self.done[batch.number] = outcome

    def stream_ended(self, stream: int) -> None:
        """An iterable worker's stream is exhausted; the epoch ends when all are."""
        self.ended_streams.add(stream)
        if len(self.ended_streams) >= self.streams:
            self.exhausted = True
            self.end = self.pulled

    def end_streams_at(self, number: int) -> None:
        """The in-process stream ended while loading task ``number`` (which delivers nothing)."""
        self.exhausted = True
        self.end = number + 1

    def next_outcome(self) -> Outcome | None:
        """The outcome of the batch the training loop waits for, if it is ready."""
        return self.done.get(self.next_to_yield)

    def advance(self) -> None:
        """The training loop has consumed ``next_to_yield``."""
        self.done.pop(self.next_to_yield, None)
        self.batches.pop(self.next_to_yield, None)
        self.next_to_yield += 1

    @property
    def finished(self) -> bool:
        return self.end is not None and self.next_to_yield >= self.end
