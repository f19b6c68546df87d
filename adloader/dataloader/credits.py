"""Which worker loads which batch, and how far ahead: credits, the prefetch window, round-robin.

Why apart: the scheduling rules are what make the loader's order and timing match torch's, and they
read the workers and the epoch without changing either's life. Each worker has ``prefetch_factor``
credits (batches outstanding at once) and the pool at most ``prefetch_factor x num_workers`` batches
beyond the one the training loop waits for, as torch's loader. While no resize is under way batch k
goes to worker k mod n (torch's round-robin); during one, the lowest pending batch goes to the
least-loaded ready worker. An iterable epoch's tasks go round its streams. The caller holds the
dispatcher's lock.
"""
from __future__ import annotations

from typing import Callable

from adloader.dataloader.messages import Task
from adloader.dataloader.table import INFLIGHT, Batch, Epoch
from adloader.dataloader.workers import STARTING, WORKING, InFlight, Slot, WorkerSet


class Scheduler:
    """Sends an epoch's batches to a pool's workers within their credits and the prefetch window."""

    def __init__(self, workers: WorkerSet, prefetch_factor: int, notify: Callable[[], None]) -> None:
        self._workers = workers
        self._prefetch = prefetch_factor
        self._notify = notify  # wakes the training loop (e.g. to learn that the epoch has ended)
        self._streams: dict[int, int] = {}  # iterable epoch: stream (worker id) -> slot token
        self._round_robin = 0
        self.window_blocked = False  # the last dispatch stopped at the window: consuming a batch reopens it

    def start_streams(self, epoch: Epoch, n: int, slots: list[Slot]) -> None:
        """An iterable epoch streams ``n`` shards, one from each of ``slots`` (ids 0..n-1; a worker that
        could not be started leaves its stream without one)."""
        epoch.streams = n
        self._streams = {s.identity.id: s.token for s in slots}
        self._round_robin = 0

    def is_stream(self, slot: Slot) -> bool:
        return slot.token in self._streams.values()

    def dispatch(self, epoch: Epoch | None, target: int) -> None:
        """Send ``epoch`` as many batches as credits and the window allow. A sampler that raises fails the epoch."""
        self.window_blocked = False
        if epoch is None or epoch.fatal is not None or epoch.finished:
            return
        try:
            if epoch.iterable:
                self._dispatch_streams(epoch)
            else:
                self._dispatch_indices(epoch, target)
        except Exception as exc:  # noqa: BLE001 - the sampler raised: the training loop sees it
            epoch.fatal = exc
            self._notify()

    def _dispatch_indices(self, epoch: Epoch, target: int) -> None:
        limit = epoch.next_to_yield + self._prefetch * target
        cycle = self._steady_workers(target)
        ready = cycle or [s for s in self._workers.slots.values() if s.state == WORKING and s.conn is not None]
        while ready:
            least_loaded = min(ready, key=lambda s: (len(s.outstanding), s.identity.id))
            if len(least_loaded.outstanding) >= self._prefetch:
                return
            batch = epoch.take(limit)
            if batch is None:
                if epoch.exhausted:
                    self._notify()  # the training loop may be waiting to learn the epoch's end
                self.window_blocked = not epoch.finished
                return
            slot = least_loaded
            if cycle and len(cycle[batch.number % len(cycle)].outstanding) < self._prefetch:
                slot = cycle[batch.number % len(cycle)]
            if not self._send_task(slot, epoch, batch):
                epoch.requeue(batch)
                ready.remove(slot)
                cycle = []

    def _steady_workers(self, target: int) -> list[Slot]:
        """The workers by id when no resize is under way (exactly ``target`` of them, ids 0..n-1, none
        retiring), else []. Then batch k goes to worker k mod n, as torch's round-robin sends it, also
        while a worker is still starting (its tasks wait in its socket, as in torch's index queue); a
        dataset whose workers wait on each other needs that. During a resize the least-loaded ready
        worker gets the next batch instead, so new workers are used at once and retiring ones are not."""
        slots = sorted(self._workers.slots.values(), key=lambda s: s.identity.id)
        steady = len(slots) == target and all(
            s.state in (STARTING, WORKING) and s.conn is not None and s.identity.id == i for i, s in enumerate(slots)
        )
        return slots if steady else []

    def _dispatch_streams(self, epoch: Epoch) -> None:
        limit = epoch.next_to_yield + self._prefetch * epoch.streams
        while not epoch.exhausted and epoch.pulled < limit:
            slot = self._next_stream(epoch)
            if slot is None:
                return
            batch = epoch.pull()
            if batch is None or not self._send_task(slot, epoch, batch):
                return
        self.window_blocked = not epoch.exhausted

    def _next_stream(self, epoch: Epoch) -> Slot | None:
        for _ in range(epoch.streams):
            stream = self._round_robin
            self._round_robin = (self._round_robin + 1) % epoch.streams
            slot = self._workers.slots.get(self._streams.get(stream, -1))
            if stream not in epoch.ended_streams and slot is not None and slot.conn is not None:
                return slot
        return None

    def _send_task(self, slot: Slot, epoch: Epoch, batch: Batch) -> bool:
        batch.state, batch.worker = INFLIGHT, slot.token
        slot.outstanding.append(InFlight(epoch.number, batch))
        if self._workers.send(slot, Task(epoch.number, batch.number, batch.payload, batch.seed)):
            return True
        slot.outstanding.pop()
        return False
