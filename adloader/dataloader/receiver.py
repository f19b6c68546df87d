"""Receiving from workers: read what each sent, rebuild and pin batches, settle them into the epoch.

Why apart: rebuilding a batch (fetching its shared-memory descriptors from the worker while
unpickling) and pinning it are the slow part of the dispatcher's work, so they run without the
dispatcher's lock; settling the result into the epoch's reorder buffer (table.py) runs with it. A
result whose tensors cannot be fetched (its worker died just after sending) is still known by
number (the header comes first), so that batch is loaded again elsewhere.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, NamedTuple

from multiprocessing.reduction import ForkingPickler
from torch._utils import ExceptionWrapper

from adloader.dataloader.deaths import blame
from adloader.dataloader.messages import Ended, FromWorker, Result
from adloader.dataloader.stats import ResizeLatencies
from adloader.dataloader.table import Epoch, Outcome
from adloader.dataloader.workers import Slot

log = logging.getLogger(__name__)


class Arrival(NamedTuple):
    """One message from a worker; a Result comes with its batch rebuilt (``data``) or why it could not be."""

    message: FromWorker
    data: Any = None
    error: BaseException | None = None


class Receiver:
    """Turns what workers send into outcomes in the epoch's reorder buffer."""

    def __init__(
        self,
        *,
        pin: Callable[[Any], Any] | None,
        close: Callable[[Slot], None],
        latencies: ResizeLatencies,
    ) -> None:
        self._pin = pin
        self._close = close  # closes a worker's connection once it reads EOF
        self._latencies = latencies

    def arrivals(self, slot: Slot, close_at_eof: bool = True) -> Iterator[Arrival]:
        """Every message waiting on a worker's connection, read without the lock (rebuilding may be slow).
        At EOF the connection is closed (``close_at_eof``; the training thread leaves that to the
        dispatcher, which waits on it): the worker is exiting, and the helper will report how."""
        conn = slot.conn
        while conn is not None and not conn.closed:
            data: Any = None
            error: BaseException | None = None
            try:
                if not conn.poll(0):
                    return
                message: FromWorker = conn.recv()
                if isinstance(message, Result):
                    data, error = self._rebuild(conn.recv_bytes())
            except (EOFError, OSError):
                if close_at_eof:
                    self._close(slot)
                return
            yield Arrival(message, data, error)

    def _rebuild(self, raw: bytes) -> tuple[Any, BaseException | None]:
        """Unpickle a batch (fetching its shared-memory descriptors from the worker) and pin it."""
        try:
            data = ForkingPickler.loads(raw)
        except Exception as exc:  # noqa: BLE001 - e.g. the worker died before we fetched its tensors
            return None, exc
        if self._pin is not None and not isinstance(data, ExceptionWrapper):
            try:
                data = self._pin(data)
            except Exception:  # noqa: BLE001 - reported as that batch's error, as torch's pin thread does
                data = ExceptionWrapper(where="in the loader's pin-memory step")
        return data, None

    def settle(self, epoch: Epoch | None, slot: Slot, arrival: Arrival) -> bool:
        """Put a Result or Ended into ``epoch`` (lock held). False when it is stale: from an older epoch,
        or for a batch that was given to another worker meanwhile."""
        message = arrival.message
        batch = slot.take(epoch, message.epoch, message.batch)
        if batch is None:
            return False
        if isinstance(message, Ended):
            epoch.resolve(batch, Outcome(skip=True))
            epoch.stream_ended(slot.identity.id)
        elif arrival.error is None:
            self._latencies.first_result(slot.token)
            epoch.resolve(batch, Outcome(data=arrival.data, n_samples=message.n_samples, failed=message.failed))
        else:
            log.info("could not receive batch %d from loader worker pid %s (%r); loading it again",
                     batch.number, slot.pid, arrival.error)
            blame(epoch, batch, f"could not be received ({arrival.error!r})")
        return True
