"""The dispatcher: one background thread per loader that keeps its workers fed, and the Pool API.

The Pool composes pieces with one job each, all called with its lock held:
  * workers.py  the worker processes and their helper: start, retire, stop, forget;
  * credits.py  which worker loads which batch, within its credits and the prefetch window;
  * receiver.py reading what workers send, rebuilding and pinning batches, settling them into the epoch;
  * deaths.py   what a worker's death does to the epoch (batches re-sent, poison batches given up);
  * stats.py    counters and resize latencies;
and the epoch's table and reorder buffer are table.py's. The thread waits on every worker's
connection, the helper's news and a wake-up pipe, and on each turn reconciles the workers towards
the target, dispatches, and applies what arrived. The training thread, while it waits for a batch,
reads what has arrived itself and sends the work that frees, and it sends the next batches when
it consumes one: a thread that launches kernels from Python holds the GIL, and the dispatcher
thread would wait for it at every system call.

Resizing is a target the thread reconciles towards, from any thread. Iterable datasets cannot move
a stream between workers, so their worker count is fixed for an epoch (changes apply at the next
one) and a dead streaming worker ends the epoch with an error.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import threading
import time
import warnings
import weakref
from multiprocessing.connection import wait as wait_for_any
from multiprocessing.context import BaseContext
from typing import Any, Callable

from adloader.dataloader.credits import Scheduler
from adloader.dataloader.deaths import describe_exit, recover
from adloader.dataloader.errors import LoaderError
from adloader.dataloader.fetch import FetchSpec
from adloader.dataloader.messages import Exited, HelperNews, InitFailed, Ready, Retired, Spawned
from adloader.dataloader.receiver import Arrival, Receiver
from adloader.dataloader.stats import LoaderCounters, ResizeLatencies
from adloader.dataloader.table import Batch, Epoch, Outcome
from adloader.dataloader.workers import STARTING, WORKING, Slot, WorkerSet

log = logging.getLogger(__name__)

_TICK_S = 0.5  # the thread re-checks its state at least this often

_PICKLE_ERRORS = (TypeError, AttributeError, pickle.PicklingError)
_PICKLE_WARNING = (  # torch's words, so that users searching for them find the cause
    "Got pickle error when attempting to start a worker Process. "
    "This might be because the worker Process arguments are not picklable. "
    "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
    "to 'forkserver', which requires the worker Process arguments to be picklable. "
    "You can also try multiprocessing.set_start_method('fork')."
)

_live_pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    """At interpreter exit, stop workers while the interpreter still works (before multiprocessing's
    own exit handler terminates the helper processes)."""
    for pool in list(_live_pools):
        pool.close()


def _as_exception(wrapper: Any) -> BaseException:
    try:
        wrapper.reraise()
    except BaseException as exc:  # noqa: BLE001 - we want the exact exception torch would raise
        return exc
    return LoaderError(f"worker start-up failed: {wrapper!r}")


class Pool:
    """Worker processes plus the dispatcher thread feeding them one epoch at a time."""

    def __init__(
        self,
        *,
        spec: FetchSpec,
        context: BaseContext,
        target: int,
        prefetch_factor: int,
        base_seed: int,
        counters: LoaderCounters,
        latencies: list[float],
        pin: Callable[[Any], Any] | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = target
        self._counters = counters
        self._clock = clock
        self._cond = threading.Condition()
        self._epoch: Epoch | None = None
        self._fatal: BaseException | None = None
        self._closing = False
        self._warnings: list[str] = []
        self._latencies = ResizeLatencies(latencies, clock)
        self._workers = WorkerSet(
            spec=spec, context=context, base_seed=base_seed, proc_root=proc_root,
            latencies=self._latencies, fail=self._fail, clock=clock,
        )
        self._scheduler = Scheduler(self._workers, prefetch_factor, notify=self._cond.notify_all)
        self._receiver = Receiver(pin=pin, close=self._workers.close_conn, latencies=self._latencies)
        self._receiving = threading.Lock()
        """Held by whichever thread reads the workers' connections: the dispatcher, or the training
        thread taking what arrived while it waits for a batch (see :meth:`_take_arrived`)."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Started here, in the thread that calls iter() (the moment torch forks its workers), not later
        # from the dispatcher thread: see spawner.py. The first workers are asked for here too, so a
        # dataset that cannot be pickled for spawn/forkserver fails at iter(), as with torch.
        try:
            with self._cond:
                if self._workers.start_spawner():
                    self._reconcile()
        except _PICKLE_ERRORS:
            warnings.warn(_PICKLE_WARNING, stacklevel=4)
            self._release()
            raise
        self._thread = threading.Thread(target=self._run, name="adloader-dispatcher", daemon=True)
        self._thread.start()
        _live_pools.add(self)

    # ------------------------------------------------------------ any thread

    @property
    def target(self) -> int:
        return self._target

    def set_target(self, n: int) -> None:
        with self._cond:
            if n > self._target:
                self._latencies.grow_asked()
            self._target = n
            self._cond.notify_all()
        self._wake()

    def running(self) -> int:
        """Workers ready for work now (not starting, not retiring)."""
        with self._cond:
            return self._workers.running()

    def worker_pids(self) -> list[int]:
        """Pids of every worker process alive or on its way out."""
        with self._cond:
            return self._workers.pids()

    def spawner_pid(self) -> int | None:
        with self._cond:
            return self._workers.spawner.pid if self._workers.spawner else None

    def take_warnings(self) -> list[str]:
        with self._cond:
            messages, self._warnings = self._warnings, []
            return messages

    def start_epoch(self, epoch: Epoch) -> None:
        """Serve ``epoch`` from now on; results of an earlier epoch still in flight are dropped."""
        with self._cond:
            self._epoch = epoch
            if self._fatal is not None:
                epoch.fatal = self._fatal
            elif epoch.iterable:
                self._start_streams(epoch)
            self._cond.notify_all()
        self._wake()

    def wait(self, epoch: Epoch, deadline: float | None) -> Outcome | Batch | None:
        """Block until the batch the training loop wants is ready. Returns its Outcome, or the Batch
        itself when the loop should load it in-process (no workers), or None at the end of the epoch.
        Raises the epoch's fatal error, or TimeoutError past ``deadline``."""
        with self._cond:
            while True:
                outcome = epoch.next_outcome()
                if outcome is not None:
                    return outcome
                if epoch.fatal is not None:
                    raise epoch.fatal
                if epoch.finished:
                    return None
                if self._closing or epoch is not self._epoch:
                    raise LoaderError(
                        "this iterator's workers were shut down or handed to a newer iter(loader); "
                        "call iter(loader) again"
                    )
                if (self._target == 0 and not epoch.iterable) or (epoch.iterable and epoch.streams == 0):
                    batch = epoch.claim_next_locally()
                    if batch is not None:
                        return batch
                    if epoch.finished:
                        return None
                if self._take_arrived():
                    continue
                timeout = _TICK_S
                if deadline is not None:
                    timeout = min(timeout, deadline - self._clock())
                    if timeout <= 0:
                        raise TimeoutError
                self._cond.wait(timeout)

    def _take_arrived(self) -> bool:
        """In the training thread, waiting for a batch (the lock held): read one message a worker
        has sent, here, as torch's loader does in ``next()``. Left to the dispatcher thread, it
        waits for the GIL at every system call while a training thread that launches kernels from
        Python holds it: on an H200 that cost a small model's loop 16 % of its throughput. False
        when nothing was waiting, or the dispatcher is reading (it notifies when it settles a batch)."""
        if not self._receiving.acquire(blocking=False):
            return False
        try:
            slots = [slot for slot in self._workers.slots.values() if slot.conn is not None]
            self._cond.release()  # rebuilding a batch may be slow: the dispatcher goes on meanwhile
            try:
                for slot in slots:
                    arrival = next(self._receiver.arrivals(slot, close_at_eof=False), None)
                    if arrival is not None:
                        with self._cond:
                            self._apply(slot, arrival)
                            self._scheduler.dispatch(self._epoch, self._target)  # its credit, used at once
                        return True
                return False
            finally:
                self._cond.acquire()
        finally:
            self._receiving.release()

    def consumed(self, epoch: Epoch) -> None:
        """The training loop took ``epoch.next_to_yield``; the window moves on."""
        with self._cond:
            epoch.advance()
            if self._scheduler.window_blocked and epoch is self._epoch and not self._closing:
                self._scheduler.dispatch(epoch, self._target)  # here, not on a thread that waits for the GIL

    def close(self) -> None:
        """Stop the thread, the workers and the helper; safe to call twice and from __del__."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._release()

    def _release(self) -> None:
        """Stop the workers and the helper and close every descriptor (the thread is not running)."""
        self._workers.release()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._closing:
                        return
                    if self._workers.spawner_hung():
                        self._restart_hung_spawner()
                    self._reconcile_or_fail()
                    self._scheduler.dispatch(self._epoch, self._target)
                    waitables = [self._wake_r, *self._workers.waitables()]
                try:
                    ready_now = wait_for_any(waitables, timeout=_TICK_S)
                except (OSError, ValueError):  # a connection the training thread closed since: list them again
                    continue
                for ready in ready_now:
                    self._on_ready(ready)
        except BaseException as exc:  # a bug here must surface in the training loop, not hang it
            log.exception("adloader dispatcher thread failed")
            with self._cond:
                error = LoaderError(f"the loader's dispatcher thread failed: {exc!r}")
                self._fatal = error
                if self._epoch is not None:
                    self._epoch.fatal = error
                self._cond.notify_all()

    def _on_ready(self, ready: Any) -> None:
        spawner = self._workers.spawner
        if ready == self._wake_r:
            self._drain_wake()
        elif spawner is not None and ready is spawner:
            self._on_spawner_news(spawner.read_news())
        elif spawner is not None and ready == spawner.sentinel:
            self._on_spawner_death()
        else:
            slot = self._workers.by_conn(ready)
            if slot is not None:
                self._receive(slot)

    def _receive(self, slot: Slot) -> None:
        """Apply every message waiting from a worker, each under the lock as it is read."""
        with self._receiving:
            for arrival in self._receiver.arrivals(slot):
                with self._cond:
                    self._apply(slot, arrival)

    def _on_spawner_news(self, news: list[HelperNews]) -> None:
        for item in news:
            if isinstance(item, Spawned):
                with self._cond:
                    self._workers.on_spawned(item.token, item.pid)
            elif isinstance(item, Exited):
                slot = self._workers.by_pid(item.pid)
                if slot is None:
                    continue
                self._receive(slot)  # whatever it sent before dying counts
                with self._cond:
                    self._on_exit(slot, item.status)

    def _on_spawner_death(self) -> None:
        spawner = self._workers.spawner
        if spawner is None:
            return
        spawner.read_news()  # it may have said Hello just before dying
        spawner.close(timeout=1.0)
        with self._cond:
            for slot in self._workers.spawner_gone():
                self._on_exit(slot, None)
            self._workers.judge_spawner_death(spawner)

    # ------------------------------------------------------------ with the lock held

    def _apply(self, slot: Slot, arrival: Arrival) -> None:
        """One message from a worker, applied to the workers or the epoch."""
        message = arrival.message
        self._counters.add_usage(message.usage)
        if isinstance(message, Ready):
            self._workers.on_ready(slot, message.pid)
        elif isinstance(message, InitFailed):
            self._fail(_as_exception(message.error))
        elif isinstance(message, Retired):
            self._workers.on_retired(slot, message.unstarted, self._epoch)
        elif self._receiver.settle(self._epoch, slot, arrival):  # Result or Ended
            self._cond.notify_all()

    def _on_exit(self, slot: Slot, status: int | None) -> None:
        """A worker exited with wait ``status`` (None: unknown, its helper died)."""
        how = describe_exit(status)
        lost = self._workers.forget(slot, how, self._epoch)
        if slot.state not in (STARTING, WORKING) and not lost:
            return  # it was retiring or stopping, and held nothing: an exit we asked for
        warning = recover(self._epoch, slot, lost, how, streaming=self._scheduler.is_stream(slot))
        if warning is not None:
            self._warnings.append(warning)
        self._cond.notify_all()

    def _restart_hung_spawner(self) -> None:
        """The helper hung inside its fork (see workers.HELPER_HELLO_S): its workers never started, so
        ``recover`` sends their batches back to the epoch unblamed (no worker was ever ready), with no
        warning for the training loop, and the next reconcile forks a new helper. An iterable epoch's
        streams are fixed at its start: that epoch ends with an error instead of a hang."""
        how = "never started (its worker-spawning helper hung inside the fork)"
        for slot in self._workers.restart_hung_spawner():
            lost = self._workers.forget(slot, how, self._epoch)
            recover(self._epoch, slot, lost, how, streaming=self._scheduler.is_stream(slot))
        self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        """The pool cannot go on: ``error`` is raised in the training loop (the first such error wins)."""
        if self._fatal is None:
            self._fatal = error
        if self._epoch is not None and self._epoch.fatal is None:
            self._epoch.fatal = error
        self._cond.notify_all()

    def _reconcile_or_fail(self) -> None:
        try:
            self._reconcile()
        except _PICKLE_ERRORS as exc:
            self._fail(LoaderError(
                f"could not pickle the dataset, collate_fn or worker_init_fn for a new loader worker: {exc!r}. "
                f"{_PICKLE_WARNING}"
            ))

    def _reconcile(self) -> None:
        """Start or retire workers until the live count equals the target."""
        if self._fatal is not None:
            return
        epoch = self._epoch
        if epoch is not None and epoch.iterable and not epoch.finished:
            return  # an iterable epoch keeps its workers (see _start_streams)
        self._workers.resize(self._target)

    def _start_streams(self, epoch: Epoch) -> None:
        """An iterable epoch gets exactly ``target`` workers with ids 0..n-1, each streaming its shard."""
        self._scheduler.start_streams(epoch, self._target, self._workers.exactly(self._target))

    # ------------------------------------------------------------ waking the thread

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # already awake (pipe full) or closing

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
