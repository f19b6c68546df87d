"""A pool's worker processes and the helper that forks them: start, retire, stop and forget each one.

Why apart: the life of a worker (asked for, starting, ready, retiring, stopping, gone) is the same
whatever the epoch does with its batches. This module keeps one ``Slot`` per worker, talks to the
helper (spawner.py), counts workers that die before they are ready and helper deaths, and gives up
with a typed error when either happens too often. What a death does to the epoch's batches is
deaths.py's; which worker gets which batch is credits.py's. The owner (the dispatcher) holds its
lock around every call.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, Callable, NamedTuple

from adloader.dataloader import handoff
from adloader.dataloader.errors import LoaderError, WorkersCannotStart
from adloader.dataloader.fetch import FetchSpec
from adloader.dataloader.messages import Retire, Stop, ToWorker, WorkerIdentity
from adloader.dataloader.spawner import WorkerSpawner
from adloader.dataloader.stats import ResizeLatencies
from adloader.dataloader.table import INFLIGHT, Batch, Epoch

log = logging.getLogger(__name__)

STARTING, WORKING, RETIRING, STOPPING = "starting", "ready", "retiring", "stopping"
START_FAILURES = 3  # this many workers in a row dying before Ready: stop trying
SPAWNER_RESTARTS = 3  # helper process deaths tolerated per pool
HELPER_HELLO_S = 5.0
"""How long a helper forked from the training process may take to say Hello before it is taken for
hung, killed and started again (the wait doubles at each hang). CPython up to 3.11 can deadlock a
child forked while another thread takes the interpreter's thread-state lock without the GIL
(CPython gh-112275): a C++ thread that enters Python for the first time does, and gloo's threads
do at every all-reduce of a DDP job. The child then hangs inside ``os.fork()`` before it runs any
Python, for good. Seen here: a Lightning DDP rank stalled for good at an epoch's start about once
in ten runs. A helper started fresh (spawn, forkserver) imports torch first, may take seconds,
and cannot hang so: it is never judged."""
HUNG_HELPERS = 3  # helpers hung at start tolerated per pool (each waited for twice as long)


class InFlight(NamedTuple):
    """A batch sent to a worker, with the number of the epoch it was sent for."""

    epoch: int
    batch: Batch


@dataclass
class Slot:
    """One worker process as the dispatcher sees it."""

    token: int
    identity: WorkerIdentity
    conn: Connection | None
    state: str = STARTING
    pid: int | None = None
    outstanding: list[InFlight] = field(default_factory=list)  # oldest first

    def is_current(self, sent: InFlight, epoch: Epoch | None) -> bool:
        """``sent`` is still this worker's to load in ``epoch`` (not an older epoch's, not re-sent elsewhere)."""
        return (
            epoch is not None and epoch.number == sent.epoch and sent.batch.state == INFLIGHT
            and sent.batch.worker == self.token and epoch.batches.get(sent.batch.number) is sent.batch
        )

    def take(self, epoch: Epoch | None, epoch_number: int, number: int) -> Batch | None:
        """Remove batch ``number`` of epoch ``epoch_number`` from what this worker holds; the batch if it
        is still current (its answer counts), else None."""
        for i, sent in enumerate(self.outstanding):
            if sent.epoch == epoch_number and sent.batch.number == number:
                del self.outstanding[i]
                return sent.batch if self.is_current(sent, epoch) else None
        return None


class WorkerSet:
    """The workers of one pool, by token, and the helper process that forks them."""

    def __init__(
        self,
        *,
        spec: FetchSpec,
        context: BaseContext,
        base_seed: int,
        proc_root: str,
        latencies: ResizeLatencies,
        fail: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots: dict[int, Slot] = {}
        self.spawner: WorkerSpawner | None = None
        self._by_pid: dict[int, Slot] = {}
        self._spec = spec
        self._context = context
        self._base_seed = base_seed
        self._proc_root = proc_root
        self._latencies = latencies
        self._fail = fail
        self._clock = clock
        self._spawner_restarts = 0
        self._start_failures = 0
        self._spawner_born = 0.0
        self._hung_helpers = 0
        self._handoff = context.get_start_method() != "fork"  # each worker gets its own pickle (handoff.py)

    # ------------------------------------------------------------ looking

    def live(self) -> list[Slot]:
        """Workers starting or ready (not retiring or stopping)."""
        return [s for s in self.slots.values() if s.state in (STARTING, WORKING)]

    def running(self) -> int:
        return sum(1 for s in self.slots.values() if s.state == WORKING)

    def pids(self) -> list[int]:
        return sorted(s.pid for s in self.slots.values() if s.pid is not None)

    def by_conn(self, conn: Any) -> Slot | None:
        return next((s for s in list(self.slots.values()) if s.conn is conn), None)

    def by_pid(self, pid: int) -> Slot | None:
        return self._by_pid.get(pid)

    def waitables(self) -> list[Any]:
        """The helper's news socket and sentinel, and every open worker connection."""
        items: list[Any] = []
        if self.spawner is not None:
            items += [self.spawner, self.spawner.sentinel]
        items += [s.conn for s in self.slots.values() if s.conn is not None]
        return items

    # ------------------------------------------------------------ starting and retiring

    def resize(self, target: int) -> None:
        """Start or retire workers until ``target`` are starting or ready; the idlest retire first."""
        live = self.live()
        for _ in range(target - len(live)):
            if self.spawn(target) is None:
                break
        self._latencies.acted_on()
        surplus = len(live) - target
        if surplus > 0:
            live.sort(key=lambda s: (s.state == WORKING, len(s.outstanding), -s.identity.id))
            for slot in live[:surplus]:
                slot.state = RETIRING
                self.send(slot, Retire())

    def exactly(self, n: int) -> list[Slot]:
        """Workers with ids 0..n-1 of a pool of ``n`` (an iterable epoch's streams): the live ones when
        they are exactly that, else they are stopped and ``n`` new ones started."""
        live = self.live()
        reusable = sorted(s.identity.id for s in live) == list(range(n)) and all(
            s.identity.num_workers == n for s in live
        )
        if reusable:
            return live
        for slot in live:
            self.stop(slot)
        return [slot for slot in (self.spawn(n, worker_id=i) for i in range(n)) if slot is not None]

    def spawn(self, num_workers: int, worker_id: int | None = None) -> Slot | None:
        """Ask the helper for one worker; None when the helper is gone (its death is handled apart)."""
        if self.spawner is None and not self.start_spawner():
            return None
        if worker_id is None:
            taken = {s.identity.id for s in self.slots.values() if s.state != STOPPING}
            worker_id = next(i for i in range(len(taken) + 1) if i not in taken)
        identity = WorkerIdentity(worker_id, num_workers, self._base_seed + worker_id)
        pickled = handoff.pickle_for_one_worker(self._spec) if self._handoff else None
        try:
            token, conn = self.spawner.spawn(identity)
        except OSError:
            return None  # the helper just died; its sentinel tells the thread
        slot = Slot(token, identity, conn)
        self.slots[token] = slot
        self._latencies.started(token)
        if pickled is not None:
            try:
                handoff.send(conn, pickled)
            except OSError:
                self.close_conn(slot)  # it died at once; the helper will report how
        return slot

    def start_spawner(self) -> bool:
        try:
            self.spawner = WorkerSpawner(self._context, self._spec, self._proc_root)
            self._spawner_born = self._clock()
        except Exception as exc:  # noqa: BLE001 - e.g. the dataset cannot be pickled for spawn
            self._fail(LoaderError(
                f"could not start the loader's worker-spawning helper process: {exc!r}. With "
                "multiprocessing_context 'spawn' or 'forkserver' the dataset, collate_fn and "
                "worker_init_fn must be picklable"
            ))
            return False
        return True

    def spawner_hung(self) -> bool:
        """The helper was forked from the training process longer ago than the Hello wait (see
        HELPER_HELLO_S) and has said nothing: it is stuck inside the fork and never will."""
        spawner = self.spawner
        wait = HELPER_HELLO_S * 2 ** self._hung_helpers
        return (spawner is not None and not self._handoff and not spawner.started  # no handoff: forked
                and self._clock() - self._spawner_born > wait and not spawner.has_news())

    def restart_hung_spawner(self) -> list[Slot]:
        """Kill the hung helper and forget it; its workers, never forked, are returned for the caller to
        forget. A new helper is forked when workers are next asked for; too many hangs fail the pool."""
        spawner = self.spawner
        assert spawner is not None
        self._hung_helpers += 1
        log.warning(
            "adloader: the loader's worker-spawning helper (pid %s) hung at its start (a fork of a multi-threaded "
            "process: CPython gh-112275, fixed in 3.12); killed it, forking another", spawner.pid,
        )
        spawner.kill()
        slots = self.spawner_gone()
        if self._hung_helpers > HUNG_HELPERS:
            self._fail(LoaderError(
                f"the loader's worker-spawning helper hung at its start {self._hung_helpers} times; a "
                "thread of this process keeps holding an interpreter lock at fork time. Use Python 3.12 or later, "
                "or multiprocessing_context='forkserver'"
            ))
        return slots

    def stop(self, slot: Slot) -> None:
        slot.state = STOPPING
        self.send(slot, Stop())

    # ------------------------------------------------------------ what workers and the helper said

    def on_spawned(self, token: int, pid: int) -> None:
        slot = self.slots.get(token)
        if slot is not None:
            slot.pid = pid
            self._by_pid[pid] = slot

    def on_ready(self, slot: Slot, pid: int) -> None:
        if slot.state == STARTING:
            slot.state = WORKING
        slot.pid = slot.pid or pid
        self._start_failures = 0

    def on_retired(self, slot: Slot, unstarted: list[int], epoch: Epoch | None) -> None:
        """A retiring worker handed back the batches it had not started; they go back to ``epoch``."""
        handed_back = set(unstarted)
        for sent in slot.outstanding:
            if sent.batch.number in handed_back and slot.is_current(sent, epoch):
                epoch.requeue(sent.batch)
        slot.outstanding.clear()
        self.stop(slot)  # everything it sent has been read: it may exit now

    def forget(self, slot: Slot, how: str, epoch: Epoch | None) -> list[Batch]:
        """A worker exited (``how``, in words): drop it, and return the batches it still held for ``epoch``,
        oldest first. Too many workers in a row dying before Ready fails the pool."""
        self.close_conn(slot)
        self.slots.pop(slot.token, None)
        if slot.pid is not None:
            self._by_pid.pop(slot.pid, None)
        self._latencies.forget(slot.token)
        lost = [sent.batch for sent in slot.outstanding if slot.is_current(sent, epoch)]
        slot.outstanding.clear()
        if slot.state == STARTING and slot.pid is not None:  # forked, then died: not a helper that died first
            self._start_failures += 1
            if self._start_failures >= START_FAILURES:
                self._fail(WorkersCannotStart(
                    f"{self._start_failures} loader workers in a row died before they were ready (the last {how}); "
                    "check worker_init_fn and the dataset's unpickling, and the memory limit"
                ))
        return lost

    def spawner_gone(self) -> list[Slot]:
        """The helper died: forget it; its workers died with it and are returned for the caller to forget."""
        self.spawner = None
        return list(self.slots.values())

    def judge_spawner_death(self, spawner: WorkerSpawner) -> None:
        """Fail the pool if the helper never started or died too often; else a new one is started when needed."""
        self._spawner_restarts += 1
        if not spawner.started:
            self._fail(LoaderError(
                f"the loader's worker-spawning helper process failed to start (exit code "
                f"{spawner.process.exitcode}). With multiprocessing_context 'spawn' or 'forkserver' the main "
                "module must be importable without side effects (put the training code under "
                "if __name__ == '__main__':) and the dataset, collate_fn and worker_init_fn picklable"
            ))
        elif self._spawner_restarts > SPAWNER_RESTARTS:
            self._fail(LoaderError(
                f"the loader's worker-spawning helper process died {self._spawner_restarts} times; giving up"
            ))
        else:
            log.warning("adloader: the loader's worker-spawning helper (pid %s) died; restarting it", spawner.pid)

    # ------------------------------------------------------------ connections

    def send(self, slot: Slot, message: ToWorker) -> bool:
        if slot.conn is None:
            return False
        try:
            slot.conn.send(message)
            return True
        except (OSError, ValueError):
            self.close_conn(slot)  # it is exiting; the helper will report how
            return False

    def close_conn(self, slot: Slot) -> None:
        if slot.conn is not None:
            try:
                slot.conn.close()
            except OSError:
                pass
            slot.conn = None

    def release(self) -> None:
        """Stop every worker and the helper and close every connection."""
        for slot in list(self.slots.values()):
            self.send(slot, Stop())
        if self.spawner is not None:
            self.spawner.close()
        for slot in self.slots.values():
            if slot.conn is not None:
                slot.conn.close()
        self.slots.clear()
