"""What PyTorch's own DataLoader tests found missing: every start method on datasets holding tensors and
multiprocessing locks, ``DataLoader[T]``, torch's round-robin dispatch, torch's warnings. Real worker
processes; each test failed before its fix."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import warnings

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info

from adloader import DataLoader
from adloader.dataloader import WorkerDiedWarning

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

START_METHODS = ["fork", "spawn", "forkserver"]
SLOW_START_METHODS = ["spawn", "forkserver"]


def tensor_dataset() -> TensorDataset:
    return TensorDataset(torch.arange(40).view(20, 2), torch.arange(20))


def expected_batches(dataset, batch_size: int) -> list[list[list[int]]]:
    return [[t.tolist() for t in batch] for batch in torch.utils.data.DataLoader(dataset, batch_size=batch_size)]


def delivered(loader) -> list[list[list[int]]]:
    return [[t.tolist() for t in batch] for batch in loader]


class LockedCounter(Dataset):
    """Holds a multiprocessing lock and a shared Value, as torch's SynchronizedDataset does."""

    def __init__(self, ctx, n: int) -> None:
        self.n = n
        self.lock = ctx.Lock()
        self.count = ctx.Value("i", 0, lock=True)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.lock:
            self.count.value += 1
        return i


class Barrier(Dataset):
    """Each of the first ``workers`` samples blocks until every worker holds one: a loader that does not
    give batch k to worker k (round-robin, as torch does) deadlocks here."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.arrived = multiprocessing.get_context("fork").Value("i", 0)
        self.barrier = multiprocessing.get_context("fork").Semaphore(0)

    def __len__(self) -> int:
        return 4 * self.workers

    def __getitem__(self, i: int) -> int:
        if i < self.workers:
            with self.arrived.get_lock():
                self.arrived.value += 1
                if self.arrived.value == self.workers:
                    self.barrier.release()
            if not self.barrier.acquire(timeout=20):
                raise RuntimeError("barrier timed out: the workers never all held a sample")
            self.barrier.release()
        return i


class WorkerOfEach(Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> int:
        return get_worker_info().id


class TooLong(IterableDataset):
    """Says it has 4 samples, yields 6."""

    def __len__(self) -> int:
        return 4

    def __iter__(self):
        return iter(range(6))


def socket_count() -> int:
    return sum(1 for target in _fd_targets() if target.startswith("socket:"))


def _fd_targets() -> list[str]:
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return targets


# ------------------------------------------------------------------ start methods


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("persistent", [False, True])
def test_every_start_method_loads_a_tensor_dataset_with_several_workers(method: str, persistent: bool) -> None:
    dataset = tensor_dataset()
    loader = DataLoader(dataset, batch_size=3, num_workers=3, multiprocessing_context=method,
                        persistent_workers=persistent)
    try:
        for _ in range(2 if persistent else 1):
            assert delivered(loader) == expected_batches(dataset, 3)
    finally:
        loader.close()


@pytest.mark.parametrize("method", SLOW_START_METHODS)
def test_workers_added_by_a_resize_or_replacing_a_dead_one_get_the_tensors(method: str) -> None:
    dataset = tensor_dataset()
    loader = DataLoader(dataset, batch_size=1, num_workers=1, multiprocessing_context=method)
    got = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerDiedWarning)
            for step, batch in enumerate(loader):
                got.append([t.tolist() for t in batch])
                if step == 2:
                    loader.set_num_workers(3)
                if step == 8:
                    os.kill(loader.worker_pids()[0], signal.SIGKILL)
    finally:
        loader.close()
    assert got == expected_batches(dataset, 1)


@pytest.mark.parametrize("method", SLOW_START_METHODS)
def test_multiprocessing_locks_and_shared_values_reach_spawned_workers(method: str) -> None:
    ctx = multiprocessing.get_context(method)
    dataset = LockedCounter(ctx, 12)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context=ctx)
    try:
        assert [b.tolist() for b in loader] == [[i, i + 1] for i in range(0, 12, 2)]
    finally:
        loader.close()
    assert dataset.count.value == 12  # the workers' increments landed in this process's shared Value


def test_an_unpicklable_worker_init_fn_under_forkserver_warns_like_torch_and_leaks_no_socket() -> None:
    before = socket_count()
    loader = DataLoader(tensor_dataset(), num_workers=2, multiprocessing_context="forkserver",
                        worker_init_fn=lambda worker_id: None)
    with pytest.warns(UserWarning, match="Got pickle error when attempting to start a worker Process"):
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            iter(loader)
    loader.close()
    assert socket_count() == before


# ------------------------------------------------------------------ torch's typing, dispatch and warnings


def test_the_loader_is_generic_like_torchs() -> None:
    alias = DataLoader[int]
    assert alias.__origin__ is DataLoader


def test_batches_go_round_robin_to_the_workers_as_in_torch() -> None:
    loader = DataLoader(WorkerOfEach(), batch_size=1, num_workers=3)
    try:
        assert [int(b) for b in loader] == [k % 3 for k in range(24)]
    finally:
        loader.close()


def test_workers_that_wait_for_each_other_finish_as_with_torch() -> None:
    loader = DataLoader(Barrier(3), batch_size=1, num_workers=3, timeout=60)
    try:
        assert [int(b) for b in loader] == list(range(12))
    finally:
        loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_longer_than_its_len_warns_like_torch(num_workers: int) -> None:
    loader = DataLoader(TooLong(), batch_size=None, num_workers=num_workers)
    assert len(loader) == 4
    with pytest.warns(UserWarning, match=r"Length of IterableDataset .* was reported to be 4"):
        values = sorted(int(x) for x in loader)
    loader.close()
    assert values == sorted(list(range(6)) * num_workers) if num_workers else values == list(range(6))


class InitialSeed(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_returning_torchs_initial_seed_collates_as_with_torch(num_workers: int) -> None:
    """Per-batch seeds are 63-bit, as torch's worker seeds: initial_seed() fits an int64 tensor."""
    loader = DataLoader(InitialSeed(), batch_size=3, num_workers=num_workers)
    try:
        seeds = [int(s) for batch in loader for s in batch]
    finally:
        loader.close()
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
