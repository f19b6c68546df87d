"""The loader pool's pieces, each on its own: scheduling (credits.py), what a death does to the epoch
(deaths.py), resize latencies (stats.py) and a worker's slot (workers.py).

In-process: the workers are slots whose connections are real pipes (what a worker would read arrives
there), and no process is started. The whole loader, with real workers, is tests/test_dataloader*.py.
"""
from __future__ import annotations

import multiprocessing
import signal
from multiprocessing.connection import Connection

import pytest

from adloader.dataloader.credits import Scheduler
from adloader.dataloader.deaths import POISON_DEATHS, blame, describe_exit, recover
from adloader.dataloader.errors import IterableWorkerDied, PoisonBatchError
from adloader.dataloader.fetch import FetchSpec
from adloader.dataloader.messages import Task, WorkerIdentity
from adloader.dataloader.stats import ResizeLatencies
from adloader.dataloader.table import INFLIGHT, PENDING, Epoch, Outcome
from adloader.dataloader.workers import RETIRING, STARTING, WORKING, InFlight, Slot, WorkerSet

pytestmark = pytest.mark.pure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def map_epoch(n_batches: int, number: int = 0) -> Epoch:
    return Epoch(number=number, base_seed=7, source=iter([[i] for i in range(n_batches)]))


def worker_set(errors: list[BaseException]) -> WorkerSet:
    spec = FetchSpec(dataset=[], iterable=False, auto_collation=True, collate_fn=list, drop_last=False, worker_init_fn=None)
    return WorkerSet(
        spec=spec, context=multiprocessing.get_context("fork"), base_seed=0, proc_root="/proc",
        latencies=ResizeLatencies([]), fail=errors.append,
    )


def add_slot(workers: WorkerSet, worker_id: int, num_workers: int, state: str, ends: list[Connection]) -> Slot:
    """A worker as the dispatcher sees it; the returned pipe end reads what the worker would be sent."""
    ours, theirs = multiprocessing.Pipe()
    ends.append(theirs)
    slot = Slot(token=worker_id, identity=WorkerIdentity(worker_id, num_workers, worker_id), conn=ours, state=state)
    workers.slots[slot.token] = slot
    return slot


def sent_batches(end: Connection) -> list[int]:
    tasks = []
    while end.poll(0):
        tasks.append(end.recv())
    assert all(isinstance(t, Task) for t in tasks)
    return [t.batch for t in tasks]


def test_steady_pool_sends_batch_k_to_worker_k_mod_n_within_credits_and_window() -> None:
    workers, ends = worker_set([]), []
    for i in range(2):
        add_slot(workers, i, 2, STARTING if i else WORKING, ends)  # a starting worker still gets its turn
    scheduler = Scheduler(workers, prefetch_factor=2, notify=lambda: None)
    epoch = map_epoch(10)
    scheduler.dispatch(epoch, target=2)
    assert [sent_batches(end) for end in ends] == [[0, 2], [1, 3]]  # each worker's 2 credits used
    assert all(epoch.batches[k].state == INFLIGHT for k in range(4))
    for k in range(4):  # every answer is in, but the training loop has consumed none
        epoch.resolve(workers.slots[k % 2].take(epoch, 0, k), Outcome(n_samples=1))
    scheduler.dispatch(epoch, target=2)
    assert [sent_batches(end) for end in ends] == [[], []]
    assert scheduler.window_blocked  # 2 x 2 batches beyond the one the loop waits for: batch 4 waits
    epoch.advance()
    scheduler.dispatch(epoch, target=2)
    assert [sent_batches(end) for end in ends] == [[4], []]


def test_during_a_resize_the_least_loaded_ready_worker_gets_the_lowest_batch() -> None:
    workers, ends = worker_set([]), []
    add_slot(workers, 0, 2, WORKING, ends)
    add_slot(workers, 1, 2, RETIRING, ends)
    add_slot(workers, 2, 3, WORKING, ends)
    scheduler = Scheduler(workers, prefetch_factor=2, notify=lambda: None)
    epoch = map_epoch(10)
    workers.slots[0].outstanding.append(InFlight(epoch.number, epoch.pull()))  # worker 0 already holds batch 0
    epoch.batches[0].state = INFLIGHT
    scheduler.dispatch(epoch, target=2)
    assert [sent_batches(end) for end in ends] == [[2], [], [1, 3]]  # the retiring worker gets nothing


def test_a_sampler_that_raises_fails_the_epoch_not_the_thread() -> None:
    def broken():
        yield [0]
        raise ValueError("sampler broke")

    workers, ends = worker_set([]), []
    add_slot(workers, 0, 1, WORKING, ends)
    woken = []
    scheduler = Scheduler(workers, prefetch_factor=4, notify=lambda: woken.append(1))
    epoch = Epoch(number=0, base_seed=0, source=broken())
    scheduler.dispatch(epoch, target=1)
    assert isinstance(epoch.fatal, ValueError) and woken


def test_a_batch_lost_poison_deaths_times_is_given_up_with_its_indices() -> None:
    epoch = map_epoch(3)
    batch = epoch.take(limit=3)
    for death in range(1, POISON_DEATHS):
        batch.state = INFLIGHT
        blame(epoch, batch, "was killed by SIGKILL")
        assert batch.state == PENDING and batch.deaths == death
        assert epoch.take(limit=3) is batch
    blame(epoch, batch, "was killed by SIGKILL")
    error = epoch.done[batch.number].error
    assert isinstance(error, PoisonBatchError)
    assert "SIGKILL" in str(error) and str(batch.payload) in str(error)


def test_a_dead_worker_is_blamed_for_its_oldest_batch_only_and_the_rest_are_resent() -> None:
    workers, ends = worker_set([]), []
    slot = add_slot(workers, 0, 1, WORKING, ends)
    Scheduler(workers, prefetch_factor=3, notify=lambda: None).dispatch(epoch := map_epoch(5), target=1)
    lost = workers.forget(slot, "was killed by SIGKILL", epoch)
    assert [b.number for b in lost] == [0, 1, 2]
    warning = recover(epoch, slot, lost, "was killed by SIGKILL", streaming=False)
    assert [b.deaths for b in lost] == [1, 0, 0]
    assert all(b.state == PENDING for b in lost)
    assert "[0, 1, 2]" in warning and "SIGKILL" in warning
    assert workers.slots == {}


def test_workers_dying_before_ready_fail_the_pool_after_three_in_a_row() -> None:
    errors: list[BaseException] = []
    workers, ends = worker_set(errors), []
    for i in range(3):
        slot = add_slot(workers, i, 3, STARTING, ends)
        slot.pid = 1000 + i  # forked (its helper said Spawned), then died
        assert recover(None, slot, workers.forget(slot, "exited with code 1", None), "exited with code 1",
                       streaming=False).endswith("starting a replacement")
    assert len(errors) == 1 and "3 loader workers in a row died before they were ready" in str(errors[0])


def test_workers_a_dead_helper_never_forked_are_not_counted_as_dying_before_ready() -> None:
    errors: list[BaseException] = []
    workers, ends = worker_set(errors), []
    for i in range(3):
        workers.forget(add_slot(workers, i, 3, STARTING, ends), "exited (status unknown: its helper process died)", None)
    assert errors == []  # the helper's deaths are counted apart (SPAWNER_RESTARTS)


def test_a_streaming_worker_dying_ends_the_iterable_epoch() -> None:
    workers, ends = worker_set([]), []
    slot = add_slot(workers, 0, 1, WORKING, ends)
    epoch = Epoch(number=0, base_seed=0, source=None, iterable_batch_size=4, streams=1)
    assert recover(epoch, slot, [], "was killed by SIGKILL", streaming=True) is None
    assert isinstance(epoch.fatal, IterableWorkerDied)


def test_exit_statuses_are_described_in_words() -> None:
    assert describe_exit(signal.SIGKILL) == "was killed by SIGKILL"  # a wait status: the signal number
    assert describe_exit(3 << 8) == "exited with code 3"
    assert "helper process died" in describe_exit(None)


def test_a_slot_ignores_answers_for_batches_it_no_longer_holds() -> None:
    workers, ends = worker_set([]), []
    slot = add_slot(workers, 0, 1, WORKING, ends)
    epoch = map_epoch(4, number=3)
    Scheduler(workers, prefetch_factor=2, notify=lambda: None).dispatch(epoch, target=1)
    assert slot.take(epoch, epoch_number=2, number=0) is None  # an older epoch's answer
    epoch.requeue(epoch.batches[1])  # re-sent elsewhere meanwhile
    assert slot.take(epoch, epoch_number=3, number=1) is None
    assert slot.take(epoch, epoch_number=3, number=0) is epoch.batches[0]
    assert slot.outstanding == []


def test_resize_latency_runs_from_the_grow_to_each_new_workers_first_batch() -> None:
    clock, out = Clock(), []
    latencies = ResizeLatencies(out, clock)
    latencies.started(0)  # a first worker, not asked for by a resize: not timed
    latencies.grow_asked()
    latencies.started(1)
    latencies.started(2)
    latencies.acted_on()
    latencies.started(3)  # started later (a replacement): not timed
    clock.now += 0.25
    for token in (0, 1, 3, 1):
        latencies.first_result(token)
    clock.now += 0.5
    latencies.forget(2)  # died before its first batch
    latencies.first_result(2)
    assert out == [0.25]
