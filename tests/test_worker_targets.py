"""No worker target is lost: one set from another thread (the reporter's) at any point of an
iteration reaches its workers.

Each race is driven deterministically: a hook runs the other thread's ``set_num_workers`` at the
exact moment of the window (the epoch's workers started, its iterator not yet registered; or
another target being applied), instead of hoping a sleep lands there. Real worker processes.
"""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from adloader import DataLoader
from adloader.dataloader.dispatcher import Pool
from adloader.dataloader.iterator import LoaderIterator

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class Indices(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


class TargetWhileStarting(DataLoader):
    """Sets ``late_target`` from another thread, once, right after ``iter()`` has started the
    epoch's workers (or chosen to load in-process) and before its iterator is registered."""

    late_target: int | None = None

    def _source_for(self, epoch: Any) -> Any:
        source = super()._source_for(epoch)
        if self.late_target is not None:
            setter = threading.Thread(target=self.set_num_workers, args=(self.late_target,))
            setter.start()
            setter.join()
            self.late_target = None
        return source


def _epoch_source_target(it: LoaderIterator) -> int:
    assert isinstance(it.source, Pool), "the epoch loads in-process: the target never reached it"
    return it.source.target


@pytest.mark.parametrize(
    ("workers", "persistent", "late"),
    [(2, False, 1), (2, True, 1), (0, False, 2), (0, True, 2)],
    ids=["pool-shrinks", "persistent-pool-shrinks", "in-process-hands-over", "persistent-in-process-hands-over"],
)
def test_a_target_set_while_the_epoch_starts_reaches_its_workers(workers: int, persistent: bool, late: int) -> None:
    loader = TargetWhileStarting(Indices(64), batch_size=4, num_workers=1, persistent_workers=persistent)
    loader.set_num_workers(workers)  # torch refuses persistent workers built with none
    loader.late_target = late
    try:
        it = iter(loader)
        assert loader.num_workers == late
        assert _epoch_source_target(it) == late
        assert [int(i) for batch in it for i in batch] == list(range(64))
        second = iter(loader)  # the next epoch starts from it too
        assert _epoch_source_target(second) == late
        assert [int(i) for batch in second for i in batch] == list(range(64))
    finally:
        loader.close()


def test_two_targets_set_at_once_end_at_the_last_one_set() -> None:
    """The reporter's target and the user's cross: the one set last is the one the workers keep,
    whatever order the two threads reach the pool in."""
    loader = DataLoader(Indices(64), batch_size=4, num_workers=2)
    it = iter(loader)
    pool = it.source
    assert isinstance(pool, Pool)
    apply_target = pool.set_target
    other = threading.Thread(target=loader.set_num_workers, args=(1,))

    def other_sets_its_target_first(n: int) -> None:
        if n == 3 and not other.is_alive() and other.ident is None:
            other.start()  # it sets 1 while this thread is on its way to apply 3
            while loader.num_workers != 1:
                pass
            other.join(timeout=0.5)  # old code: it applies 1 here, before this thread's 3
        apply_target(n)

    pool.set_target = other_sets_its_target_first  # type: ignore[method-assign]
    try:
        loader.set_num_workers(3)
        other.join()
        assert loader.num_workers == 1
        assert pool.target == 1, "the workers were left at a target set before the last one"
        assert [int(i) for batch in it for i in batch] == list(range(64))
    finally:
        loader.close()


def test_a_persistent_loader_given_workers_mid_epoch_keeps_them_for_its_next_epochs() -> None:
    loader = DataLoader(Indices(64), batch_size=4, num_workers=1, persistent_workers=True)
    loader.set_num_workers(0)  # torch refuses persistent workers built with none
    try:
        it = iter(loader)
        seen = [int(i) for i in next(it)]
        loader.set_num_workers(2)  # the epoch hands over to a pool, which the loader keeps
        pool = it.source
        assert isinstance(pool, Pool)
        seen += [int(i) for batch in it for i in batch]
        assert seen == list(range(64))
        second = iter(loader)
        assert second.source is pool, "the epoch's end closed the persistent workers"
        assert [int(i) for batch in second for i in batch] == list(range(64))
    finally:
        loader.close()
