"""The dispatcher: one background thread that owns a loader's workers and keeps them fed.

It holds the current epoch's table (see table.py) and, per worker, the
batches in flight there. Each worker has ``prefetch_factor`` credits (batches
outstanding at once) and the whole pool at most ``prefetch_factor x
num_workers`` batches beyond the one the training loop waits for, as torch's
loader; the least-loaded ready worker gets the lowest pending batch.

Resizing is a target the thread reconciles towards, from any thread:
  * grow: ask the helper process (spawner.py) for a worker; it gets work once Ready;
  * shrink: Retire the idlest workers; each finishes the batch it is on, hands
    back the ones it had not started (they are re-sent to others) and exits.
  * death: the helper reports every worker exit with its wait status. The
    batches the dead worker held go back to the table, the one it was working
    on (the oldest) is blamed, and a batch blamed ``POISON_DEATHS`` times is
    given up with an error naming its indices. A replacement is started.
Iterable datasets cannot move a stream between workers, so their worker count
is fixed for an epoch (changes apply at the next one) and a dead streaming
worker ends the epoch with an error.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from torch._utils import ExceptionWrapper

from adloader.dataloader import handoff
from adloader.dataloader.errors import IterableWorkerDied, LoaderError, PoisonBatchError, WorkersCannotStart
from adloader.dataloader.fetch import FetchSpec
from adloader.dataloader.spawner import EXITED, SPAWNED, WorkerSpawner
from adloader.dataloader.stats import LoaderCounters
from adloader.dataloader.table import INFLIGHT, Batch, Epoch, Outcome
from adloader.dataloader.messages import (
    Ended, FromWorker, InitFailed, Ready, Result, Retire, Retired, Stop, Task, ToWorker, Usage,
)
from adloader.dataloader.worker import WorkerIdentity

log = logging.getLogger(__name__)

STARTING, WORKING, RETIRING, STOPPING = "starting", "ready", "retiring", "stopping"
POISON_DEATHS = 3  # a batch that killed this many workers is given up
START_FAILURES = 3  # this many workers in a row dying before Ready: stop trying
SPAWNER_RESTARTS = 3  # helper process deaths tolerated per pool
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


@dataclass
class Slot:
    """One worker process as the dispatcher sees it."""

    token: int
    identity: WorkerIdentity
    conn: Connection | None
    state: str = STARTING
    pid: int | None = None
    outstanding: list[tuple[int, Batch]] = field(default_factory=list)  # (epoch number, batch), oldest first
    asked_at: float | None = None  # when set_num_workers asked for this worker (resize latency)
    first_result_at: float | None = None


def _describe_exit(status: int | None) -> str:
    if status is None:
        return "exited (status unknown: its helper process died)"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


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
        self._spec = spec
        self._context = context
        self._target = target
        self._prefetch = prefetch_factor
        self._base_seed = base_seed
        self._counters = counters
        self._pin = pin
        self._proc_root = proc_root
        self._clock = clock
        self._cond = threading.Condition()
        self._slots: dict[int, Slot] = {}
        self._by_pid: dict[int, Slot] = {}
        self._spawner: WorkerSpawner | None = None
        self._spawner_restarts = 0
        self._start_failures = 0
        self._epoch: Epoch | None = None
        self._streams: dict[int, int] = {}  # iterable epoch: stream (worker id) -> slot token
        self._round_robin = 0
        self._fatal: BaseException | None = None
        self._closing = False
        self._window_blocked = False
        self._asked_at: float | None = None
        self._latencies = latencies
        self._warnings: list[str] = []
        self._handoff = context.get_start_method() != "fork"  # each worker gets its own pickle (handoff.py)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Started here, in the thread that calls iter() (the moment torch forks its workers), not later
        # from the dispatcher thread: see spawner.py. The first workers are asked for here too, so a
        # dataset that cannot be pickled for spawn/forkserver fails at iter(), as with torch.
        try:
            with self._cond:
                if self._start_spawner():
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
                self._asked_at = self._clock()
            self._target = n
            self._cond.notify_all()
        self._wake()

    def running(self) -> int:
        """Workers ready for work now (not starting, not retiring)."""
        with self._cond:
            return sum(1 for s in self._slots.values() if s.state == WORKING)

    def worker_pids(self) -> list[int]:
        """Pids of every worker process alive or on its way out."""
        with self._cond:
            return sorted(s.pid for s in self._slots.values() if s.pid is not None)

    def spawner_pid(self) -> int | None:
        with self._cond:
            return self._spawner.pid if self._spawner else None

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
                timeout = _TICK_S
                if deadline is not None:
                    timeout = min(timeout, deadline - self._clock())
                    if timeout <= 0:
                        raise TimeoutError
                self._cond.wait(timeout)

    def consumed(self, epoch: Epoch) -> None:
        """The training loop took ``epoch.next_to_yield``; the window moves on."""
        with self._cond:
            epoch.advance()
            blocked = self._window_blocked
        if blocked:
            self._wake()

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
        for slot in list(self._slots.values()):
            self._send(slot, Stop())
        if self._spawner is not None:
            self._spawner.close()
        for slot in self._slots.values():
            if slot.conn is not None:
                slot.conn.close()
        self._slots.clear()
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
                    self._reconcile_or_fail()
                    self._dispatch()
                    waitables = self._waitables()
                for ready in wait_for_any(waitables, timeout=_TICK_S):
                    self._on_ready(ready)
        except BaseException as exc:  # a bug here must surface in the training loop, not hang it
            log.exception("adloader dispatcher thread failed")
            with self._cond:
                error = LoaderError(f"the loader's dispatcher thread failed: {exc!r}")
                self._fatal = error
                if self._epoch is not None:
                    self._epoch.fatal = error
                self._cond.notify_all()

    def _waitables(self) -> list[Any]:
        items: list[Any] = [self._wake_r]
        if self._spawner is not None:
            items += [self._spawner, self._spawner.sentinel]
        items += [s.conn for s in self._slots.values() if s.conn is not None]
        return items

    def _on_ready(self, ready: Any) -> None:
        if ready == self._wake_r:
            self._drain_wake()
        elif self._spawner is not None and ready is self._spawner:
            self._on_spawner_news(self._spawner.read_news())
        elif self._spawner is not None and ready == self._spawner.sentinel:
            self._on_spawner_death()
        else:
            slot = next((s for s in list(self._slots.values()) if s.conn is ready), None)
            if slot is not None:
                self._receive(slot)

    def _receive(self, slot: Slot) -> None:
        """Read every message waiting on a worker's connection (unlocked: rebuilding a batch may be slow)."""
        conn = slot.conn
        while conn is not None and not conn.closed:
            try:
                if not conn.poll(0):
                    return
                message: FromWorker = conn.recv()
                if isinstance(message, Result):
                    data, error = self._rebuild(conn.recv_bytes())
            except (EOFError, OSError):
                self._close_conn(slot)  # the worker is exiting; the helper will report how
                return
            with self._cond:
                self._count_usage(message.usage)
                if not isinstance(message, Result):
                    self._on_message(slot, message)
                elif error is None:
                    self._on_result(slot, message, data)
                else:
                    self._on_lost_result(slot, message, error)

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

    # ------------------------------------------------------------ with the lock held

    def _count_usage(self, usage: Usage) -> None:
        self._counters.worker_cpu_s += usage.cpu_s
        self._counters.read_bytes += usage.read_bytes

    def _on_message(self, slot: Slot, message: FromWorker) -> None:
        if isinstance(message, Ready):
            if slot.state == STARTING:
                slot.state = WORKING
            slot.pid = slot.pid or message.pid
            self._start_failures = 0
        elif isinstance(message, Ended):
            batch = self._take_outstanding(slot, message.epoch, message.batch)
            if batch is not None:
                self._epoch.resolve(batch, Outcome(skip=True))
                self._epoch.stream_ended(slot.identity.id)
                self._cond.notify_all()
        elif isinstance(message, Retired):
            handed_back = set(message.unstarted)
            for epoch_number, batch in slot.outstanding:
                if batch.number in handed_back and self._is_current(epoch_number, batch, slot):
                    self._epoch.requeue(batch)
            slot.outstanding.clear()
            slot.state = STOPPING  # everything it sent has been read: it may exit now
            self._send(slot, Stop())
        elif isinstance(message, InitFailed):
            self._set_fatal(_as_exception(message.error))

    def _on_result(self, slot: Slot, header: Result, data: Any) -> None:
        batch = self._take_outstanding(slot, header.epoch, header.batch)
        if batch is not None:
            self._record_first_result(slot)
            self._epoch.resolve(batch, Outcome(data=data, n_samples=header.n_samples, failed=header.failed))
            self._cond.notify_all()

    def _on_lost_result(self, slot: Slot, header: Result, error: BaseException) -> None:
        """A batch arrived but could not be rebuilt: load it again elsewhere (counted like a death)."""
        batch = self._take_outstanding(slot, header.epoch, header.batch)
        if batch is None:
            return
        log.info("could not receive batch %d from loader worker pid %s (%r); loading it again",
                 batch.number, slot.pid, error)
        self._requeue_or_give_up(batch, f"could not be received ({error!r})")
        self._cond.notify_all()

    def _requeue_or_give_up(self, batch: Batch, how: str) -> None:
        batch.deaths += 1
        if batch.deaths >= POISON_DEATHS:
            self._epoch.resolve(batch, Outcome(error=PoisonBatchError(batch.number, batch.payload, batch.deaths, how)))
        else:
            self._epoch.requeue(batch)

    def _take_outstanding(self, slot: Slot, epoch_number: int, number: int) -> Batch | None:
        for i, (e, batch) in enumerate(slot.outstanding):
            if e == epoch_number and batch.number == number:
                del slot.outstanding[i]
                return batch if self._is_current(e, batch, slot) else None
        return None

    def _is_current(self, epoch_number: int, batch: Batch, slot: Slot) -> bool:
        epoch = self._epoch
        return (
            epoch is not None and epoch.number == epoch_number and batch.state == INFLIGHT
            and batch.worker == slot.token and epoch.batches.get(batch.number) is batch
        )

    def _record_first_result(self, slot: Slot) -> None:
        if slot.first_result_at is None:
            slot.first_result_at = self._clock()
            if slot.asked_at is not None:
                self._latencies.append(slot.first_result_at - slot.asked_at)

    def _on_spawner_news(self, news: list[tuple]) -> None:
        for item in news:
            if item[0] == SPAWNED:
                _, token, pid = item
                with self._cond:
                    slot = self._slots.get(token)
                    if slot is not None:
                        slot.pid = pid
                        self._by_pid[pid] = slot
            elif item[0] == EXITED:
                _, pid, status = item
                slot = self._by_pid.get(pid)
                if slot is None:
                    continue
                self._receive(slot)  # whatever it sent before dying counts
                with self._cond:
                    self._on_exit(slot, status)

    def _on_exit(self, slot: Slot, status: int | None) -> None:
        self._close_conn(slot)
        self._slots.pop(slot.token, None)
        if slot.pid is not None:
            self._by_pid.pop(slot.pid, None)
        lost = [(e, b) for e, b in slot.outstanding if self._is_current(e, b, slot)]
        slot.outstanding.clear()
        unexpected = slot.state in (STARTING, WORKING) or bool(lost)
        if not unexpected:
            return
        how = _describe_exit(status)
        epoch = self._epoch
        if slot.state == STARTING:
            self._start_failures += 1
            if self._start_failures >= START_FAILURES:
                self._set_fatal(WorkersCannotStart(
                    f"{self._start_failures} loader workers in a row died before they were ready (the last {how}); "
                    "check worker_init_fn and the dataset's unpickling, and the memory limit"
                ))
        if epoch is not None and epoch.iterable and slot.token in self._streams.values():
            if slot.identity.id not in epoch.ended_streams and not epoch.finished:
                epoch.fatal = IterableWorkerDied(
                    f"loader worker {slot.identity.id} (pid {slot.pid}) {how} while streaming an IterableDataset; "
                    "its position in the stream cannot be recovered, so this epoch ends here"
                )
            self._cond.notify_all()
            return
        for position, (_, batch) in enumerate(lost):
            if position == 0 and slot.state == WORKING:  # workers load in order: the oldest is the one it was on
                self._requeue_or_give_up(batch, how)
            else:
                epoch.requeue(batch)
        if lost:
            numbers = [b.number for _, b in lost]
            self._warnings.append(
                f"loader worker {slot.identity.id} (pid {slot.pid}) {how}; its unfinished batches {numbers} "
                "were given to the other workers"
            )
        else:
            self._warnings.append(f"loader worker {slot.identity.id} (pid {slot.pid}) {how}; starting a replacement")
        self._cond.notify_all()

    def _on_spawner_death(self) -> None:
        spawner = self._spawner
        if spawner is None:
            return
        spawner.read_news()  # it may have said HELLO just before dying
        spawner.close(timeout=1.0)
        with self._cond:
            self._spawner = None
            for slot in list(self._slots.values()):
                self._on_exit(slot, None)
            self._spawner_restarts += 1
            if not spawner.started:
                self._set_fatal(LoaderError(
                    f"the loader's worker-spawning helper process failed to start (exit code "
                    f"{spawner.process.exitcode}). With multiprocessing_context 'spawn' or 'forkserver' the main "
                    "module must be importable without side effects (put the training code under "
                    "if __name__ == '__main__':) and the dataset, collate_fn and worker_init_fn picklable"
                ))
            elif self._spawner_restarts > SPAWNER_RESTARTS:
                self._set_fatal(LoaderError(
                    f"the loader's worker-spawning helper process died {self._spawner_restarts} times; giving up"
                ))
            else:
                log.warning("adloader: the loader's worker-spawning helper (pid %s) died; restarting it", spawner.pid)

    def _set_fatal(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        if self._epoch is not None and self._epoch.fatal is None:
            self._epoch.fatal = error
        self._cond.notify_all()

    def _reconcile_or_fail(self) -> None:
        try:
            self._reconcile()
        except _PICKLE_ERRORS as exc:
            self._set_fatal(LoaderError(
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
        live = [s for s in self._slots.values() if s.state in (STARTING, WORKING)]
        for _ in range(self._target - len(live)):
            if self._spawn(self._target) is None:
                break
        self._asked_at = None
        surplus = len(live) - self._target
        if surplus > 0:
            live.sort(key=lambda s: (s.state == WORKING, len(s.outstanding), -s.identity.id))
            for slot in live[:surplus]:
                slot.state = RETIRING
                self._send(slot, Retire())

    def _start_streams(self, epoch: Epoch) -> None:
        """An iterable epoch gets exactly ``target`` workers with ids 0..n-1, each streaming its shard."""
        n = self._target
        live = [s for s in self._slots.values() if s.state in (STARTING, WORKING)]
        reusable = sorted(s.identity.id for s in live) == list(range(n)) and all(
            s.identity.num_workers == n for s in live
        )
        if not reusable:
            for slot in live:
                slot.state = STOPPING
                self._send(slot, Stop())
            live = [slot for slot in (self._spawn(n, worker_id=i) for i in range(n)) if slot is not None]
        epoch.streams = n
        self._streams = {s.identity.id: s.token for s in live}
        self._round_robin = 0

    def _spawn(self, num_workers: int, worker_id: int | None = None) -> Slot | None:
        """Ask the helper for one worker; None when the helper is gone (its death is handled apart)."""
        if self._spawner is None and not self._start_spawner():
            return None
        if worker_id is None:
            taken = {s.identity.id for s in self._slots.values() if s.state != STOPPING}
            worker_id = next(i for i in range(len(taken) + 1) if i not in taken)
        identity = WorkerIdentity(worker_id, num_workers, self._base_seed + worker_id)
        pickled = handoff.pickle_for_one_worker(self._spec) if self._handoff else None
        try:
            token, conn = self._spawner.spawn(identity)
        except OSError:
            return None  # the helper just died; its sentinel tells the thread
        slot = Slot(token, identity, conn, asked_at=self._asked_at)
        self._slots[token] = slot
        if pickled is not None:
            try:
                handoff.send(conn, *pickled)
            except OSError:
                self._close_conn(slot)  # it died at once; the helper will report how
        return slot

    def _start_spawner(self) -> bool:
        try:
            self._spawner = WorkerSpawner(self._context, self._spec, self._proc_root)
        except Exception as exc:  # noqa: BLE001 - e.g. the dataset cannot be pickled for spawn
            self._set_fatal(LoaderError(
                f"could not start the loader's worker-spawning helper process: {exc!r}. With "
                "multiprocessing_context 'spawn' or 'forkserver' the dataset, collate_fn and "
                "worker_init_fn must be picklable"
            ))
            return False
        return True

    def _dispatch(self) -> None:
        epoch = self._epoch
        self._window_blocked = False
        if epoch is None or epoch.fatal is not None or epoch.finished:
            return
        try:
            if epoch.iterable:
                self._dispatch_streams(epoch)
            else:
                self._dispatch_indices(epoch)
        except Exception as exc:  # noqa: BLE001 - the sampler raised: the training loop sees it
            epoch.fatal = exc
            self._cond.notify_all()

    def _dispatch_indices(self, epoch: Epoch) -> None:
        limit = epoch.next_to_yield + self._prefetch * self._target
        cycle = self._steady_workers()
        ready = cycle or [s for s in self._slots.values() if s.state == WORKING and s.conn is not None]
        while ready:
            least_loaded = min(ready, key=lambda s: (len(s.outstanding), s.identity.id))
            if len(least_loaded.outstanding) >= self._prefetch:
                return
            batch = epoch.take(limit)
            if batch is None:
                if epoch.exhausted:
                    self._cond.notify_all()  # the training loop may be waiting to learn the epoch's end
                self._window_blocked = not epoch.finished
                return
            slot = least_loaded
            if cycle and len(cycle[batch.number % len(cycle)].outstanding) < self._prefetch:
                slot = cycle[batch.number % len(cycle)]
            if not self._send_task(slot, epoch, batch):
                epoch.requeue(batch)
                ready.remove(slot)
                cycle = []

    def _steady_workers(self) -> list[Slot]:
        """The workers by id when no resize is under way (exactly ``target`` of them, ids 0..n-1, none
        retiring), else []. Then batch k goes to worker k mod n, as torch's round-robin sends it, also
        while a worker is still starting (its tasks wait in its socket, as in torch's index queue); a
        dataset whose workers wait on each other needs that. During a resize the least-loaded ready
        worker gets the next batch instead, so new workers are used at once and retiring ones are not."""
        slots = sorted(self._slots.values(), key=lambda s: s.identity.id)
        steady = len(slots) == self._target and all(
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
        self._window_blocked = not epoch.exhausted

    def _next_stream(self, epoch: Epoch) -> Slot | None:
        for _ in range(epoch.streams):
            stream = self._round_robin
            self._round_robin = (self._round_robin + 1) % epoch.streams
            slot = self._slots.get(self._streams.get(stream, -1))
            if stream not in epoch.ended_streams and slot is not None and slot.conn is not None:
                return slot
        return None

    def _send_task(self, slot: Slot, epoch: Epoch, batch: Batch) -> bool:
        batch.state, batch.worker = INFLIGHT, slot.token
        slot.outstanding.append((epoch.number, batch))
        if self._send(slot, Task(epoch.number, batch.number, batch.payload, batch.seed)):
            return True
        slot.outstanding.pop()
        return False

    def _send(self, slot: Slot, message: ToWorker) -> bool:
        if slot.conn is None:
            return False
        try:
            slot.conn.send(message)
            return True
        except (OSError, ValueError):
            self._close_conn(slot)  # it is exiting; the helper will report how
            return False

    def _close_conn(self, slot: Slot) -> None:
        if slot.conn is not None:
            try:
                slot.conn.close()
            except OSError:
                pass
            slot.conn = None

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
