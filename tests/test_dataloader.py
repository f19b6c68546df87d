"""adloader.DataLoader against torch's DataLoader and its own promises: same batches, live resizes,
dead workers, per-batch seeding, checkpoints, and no process left behind. Real worker processes
throughout; datasets return their indices so delivery can be checked exactly."""
from __future__ import annotations

import logging
import multiprocessing.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, RandomSampler, SequentialSampler, get_worker_info

from adloader import DataLoader
from adloader.dataloader import workers as workers_module
from adloader.dataloader import BadLoaderState, BadWorkerCount, PoisonBatchError, UnsupportedOption, WorkerDiedWarning
from adloader.dataloader.errors import LoaderError
from adloader.dataloader.stats import LoaderCounters, StepTimer

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class Indices(Dataset):
    """Sample i is the tensor [i]; ``delay`` seconds of work per sample."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor([i])


class Augmented(Dataset):
    """Sample i plus random draws from the three RNGs an augmentation pipeline uses."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, torch.rand(()).item(), random.random(), float(np.random.rand())], dtype=torch.float64)


class Shards(IterableDataset):
    """Each worker streams every num_workers-th number, as torch's docs recommend."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        wid, count = (info.id, info.num_workers) if info else (0, 1)
        return iter(range(wid, self.n, count))


def flat(batches) -> list[int]:
    return [int(x) for b in batches for x in b.view(-1).tolist()]


def lists(loader) -> list[list[int]]:
    return [b.view(-1).tolist() for b in loader]


def alive(pids) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


# ------------------------------------------------------------------ same batches as torch


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_equal_torchs_batch_for_batch(num_workers: int, persistent: bool, shuffle: bool,
                                              drop_last: bool) -> None:
    def run(cls) -> list[list[list[int]]]:
        loader = cls(Indices(53), batch_size=5, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers,
                     generator=torch.Generator().manual_seed(7), persistent_workers=persistent)
        return [lists(loader) for _ in range(2)]  # two epochs: the generator carries over

    assert run(DataLoader) == run(torch.utils.data.DataLoader)


def test_global_rng_draws_match_torch_when_no_generator_is_given() -> None:
    def run(cls) -> list[list[int]]:
        torch.manual_seed(11)
        first = lists(cls(Indices(30), batch_size=4, shuffle=True, num_workers=2))
        return first + [[int(torch.randint(0, 1000, ()))]]  # the global RNG is left where torch leaves it

    assert run(DataLoader) == run(torch.utils.data.DataLoader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_samplers_and_unbatched_loading_equal_torch(num_workers: int) -> None:
    dataset = Indices(23)
    cases = [
        dict(sampler=RandomSampler(dataset, replacement=True, num_samples=31, generator=torch.Generator().manual_seed(3)),
             batch_size=4),
        dict(batch_sampler=BatchSampler(SequentialSampler(dataset), 6, drop_last=False)),
        dict(batch_size=None),
    ]
    for kwargs in cases:
        ours = lists(DataLoader(dataset, num_workers=num_workers, **kwargs))
        if "sampler" in kwargs:
            kwargs["sampler"].generator.manual_seed(3)
        theirs = lists(torch.utils.data.DataLoader(dataset, num_workers=num_workers, **kwargs))
        assert ours == theirs


@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset_equals_torch(num_workers: int, drop_last: bool) -> None:
    ours = lists(DataLoader(Shards(50), batch_size=4, num_workers=num_workers, drop_last=drop_last))
    theirs = lists(torch.utils.data.DataLoader(Shards(50), batch_size=4, num_workers=num_workers, drop_last=drop_last))
    assert ours == theirs


def test_it_is_a_torch_dataloader_with_torchs_attributes() -> None:
    loader = DataLoader(Indices(10), batch_size=3, num_workers=2)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert len(loader) == 4 and loader.batch_size == 3 and loader.num_workers == 2
    assert len(iter(loader)) == 4


def test_unsupported_options_are_rejected_with_a_reason() -> None:
    with pytest.raises(UnsupportedOption, match="in_order=False"):
        DataLoader(Indices(4), in_order=False)
    with pytest.raises(UnsupportedOption, match="prefetch_factor=0"):
        DataLoader(Indices(4), num_workers=1, prefetch_factor=0)
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):  # torch's own check
        DataLoader(Indices(4), shuffle=True, sampler=SequentialSampler(range(4)))
    loader = DataLoader(Indices(4))
    for bad in (-1, 5000, 1.5, "2"):
        with pytest.raises(BadWorkerCount):
            loader.set_num_workers(bad)


# ------------------------------------------------------------------ the worker's world


def _record_init(worker_id: int) -> None:
    os.environ["ADL_TEST_INIT"] = str(worker_id)
    os.environ["ADL_TEST_INITIAL_SEED"] = str(torch.initial_seed())


class WhoLoads(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        return torch.tensor([i, info.id, info.num_workers, int(os.environ["ADL_TEST_INIT"]), os.getpid(),
                             torch.get_num_threads(), int(os.environ["ADL_TEST_INITIAL_SEED"]) - info.seed])


def test_workers_see_get_worker_info_and_ran_worker_init_fn() -> None:
    loader = DataLoader(WhoLoads(), batch_size=2, num_workers=2, worker_init_fn=_record_init)
    rows = torch.cat(list(loader)).tolist()
    assert [r[0] for r in rows] == list(range(12))
    assert {r[1] for r in rows} <= {0, 1} and all(r[2] == 2 for r in rows)
    assert all(r[3] == r[1] for r in rows)  # worker_init_fn ran in that worker with its id
    assert all(r[6] == 0 for r in rows)  # ... seeded as torch seeds a worker: torch.initial_seed() == info.seed
    assert os.getpid() not in {r[4] for r in rows} and all(r[5] == 1 for r in rows)


class FailsAt(Dataset):
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise KeyError(f"no sample {i}")
        return torch.tensor([i])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_error_is_raised_at_its_batch_and_the_epoch_goes_on(num_workers: int) -> None:
    it = iter(DataLoader(FailsAt(5), batch_size=2, num_workers=num_workers))
    assert flat([next(it), next(it)]) == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="no sample 5"):
        next(it)
    assert flat(it) == [6, 7, 8, 9, 10, 11]


def test_timeout_raises_like_torch() -> None:
    loader = DataLoader(Indices(4, delay=3.0), batch_size=2, num_workers=1, timeout=0.3)
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
        next(iter(loader))
    loader.close()


def test_pin_memory_without_an_accelerator_warns_and_still_loads() -> None:
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: pinning really happens")
    with pytest.warns(UserWarning, match="pin_memory"):
        batches = lists(DataLoader(Indices(6), batch_size=3, num_workers=1, pin_memory=True))
    assert batches == [[0, 1, 2], [3, 4, 5]]


class NeedsPickling(Dataset):
    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, os.getpid()])


def test_spawn_context_loads_and_resizes() -> None:
    loader = DataLoader(NeedsPickling(), batch_size=1, num_workers=1, multiprocessing_context="spawn")
    it = iter(loader)
    rows = [next(it)]
    loader.set_num_workers(2)
    rows += list(it)
    assert [int(r[0, 0]) for r in rows] == list(range(9))
    assert os.getpid() not in {int(r[0, 1]) for r in rows}


class MixedTensors(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return {"small": torch.full((3,), i, dtype=torch.bfloat16), "flag": torch.tensor(i % 2 == 0),
                "empty": torch.zeros(0, 2), "big": torch.full((40_000,), float(i)), "t": torch.arange(6.0).view(2, 3).t()}


def test_small_tensors_arrive_by_value_and_large_ones_through_shared_memory() -> None:
    ours = list(DataLoader(MixedTensors(), batch_size=2, num_workers=1))
    theirs = list(torch.utils.data.DataLoader(MixedTensors(), batch_size=2, num_workers=1))
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        assert not a["small"].is_shared() and a["big"].is_shared()


SCRIPT_WITHOUT_MAIN_GUARD = """
import torch
from adloader import DataLoader

class Squares(torch.utils.data.Dataset):   # defined in __main__, as many training scripts do
    def __len__(self):
        return 30
    def __getitem__(self, i):
        return i * i

loader = DataLoader(Squares(), batch_size=3, num_workers=2)
out = []
for k, batch in enumerate(loader):
    out += batch.tolist()
    if k == 2:
        loader.set_num_workers(3)
print(out == [i * i for i in range(30)], len(loader.worker_pids()))
"""


def test_a_script_that_works_with_torchs_loader_works_unchanged(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_WITHOUT_MAIN_GUARD)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                              os.environ.get("PYTHONPATH", "")])}
    environ = {k: v for k, v in environ.items() if not k.startswith("ADLOADER_")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "0"]  # all delivered; the epoch's workers are gone after it


# ------------------------------------------------------------------ resizing and dying


def _take_until(it, seen: list[int], condition, timeout: float = 30.0) -> None:
    """Keep training (taking batches) until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the resize did not take effect"
        seen += next(it).view(-1).tolist()


def test_resize_mid_epoch_up_down_to_zero_and_back_delivers_everything_in_order() -> None:
    loader = DataLoader(Indices(100_000, delay=0.0005), batch_size=2, num_workers=2)
    it = iter(loader)
    seen: list[int] = []
    for n in (4, 1, 0, 3, 1):
        loader.set_num_workers(n)
        assert loader.num_workers == n
        _take_until(it, seen, lambda: loader.running_workers() == len(loader.worker_pids()) == n)
    seen += flat(next(it) for _ in range(20))
    loader.close()
    assert seen == list(range(len(seen)))


def test_zero_workers_grow_mid_epoch_into_a_pool() -> None:
    loader = DataLoader(Indices(100_000, delay=0.0005), batch_size=2, num_workers=0)
    it = iter(loader)
    seen = flat([next(it) for _ in range(3)])
    loader.set_num_workers(2)
    _take_until(it, seen, lambda: loader.running_workers() == 2)
    seen += flat(next(it) for _ in range(20))
    loader.close()
    assert seen == list(range(len(seen)))


def test_set_num_workers_from_another_thread_takes_effect() -> None:
    loader = DataLoader(Indices(100_000, delay=0.0005), batch_size=2, num_workers=1, persistent_workers=True)
    it = iter(loader)
    seen = flat([next(it)])
    threading.Thread(target=loader.set_num_workers, args=(3,)).start()
    _take_until(it, seen, lambda: len(loader.resize_latencies()) == 2)
    assert loader.running_workers() == 3
    loader.close()
    assert seen == list(range(len(seen)))


def test_a_killed_worker_warns_and_its_batches_are_loaded_by_others() -> None:
    loader = DataLoader(Indices(60, delay=0.003), batch_size=2, num_workers=2)
    seen = []
    with pytest.warns(WorkerDiedWarning, match="SIGKILL"):
        for k, batch in enumerate(loader):
            seen += batch.view(-1).tolist()
            if k == 3:
                os.kill(loader.worker_pids()[0], signal.SIGKILL)
    assert seen == list(range(60))


class KillsItsLoader(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in (8, 9):
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


def test_a_batch_that_kills_every_worker_ends_in_an_error_naming_its_indices() -> None:
    loader = DataLoader(KillsItsLoader(), batch_size=2, num_workers=2)
    it = iter(loader)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerDiedWarning)
        while True:
            try:
                seen += next(it).view(-1).tolist()
            except PoisonBatchError as exc:
                assert exc.batch == 4 and exc.indices == [8, 9]
                assert "[8, 9]" in str(exc) and "SIGKILL" in str(exc)
                break
        seen += flat(it)
    assert seen == [i for i in range(20) if i not in (8, 9)]


def test_the_spawner_helper_dying_is_survived() -> None:
    loader = DataLoader(Indices(60, delay=0.003), batch_size=2, num_workers=2)
    it = iter(loader)
    seen = flat([next(it)])
    os.kill(it.source.spawner_pid(), signal.SIGKILL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerDiedWarning)
        seen += flat(it)
    assert seen == list(range(60))


class HangingHelpers:
    """Makes worker-spawning helpers hang at their start, as one forked while another thread held an
    interpreter lock does (CPython gh-112275): multiprocessing runs this after-fork function in each
    process it forks (the helpers; their workers are forked with os.fork and do not run it). The first
    ``hangs`` helpers to start sleep for an hour instead of saying Hello."""

    def __init__(self, folder: Path, hangs: int) -> None:
        self.markers = [folder / f"hung-{k}" for k in range(hangs)]
        multiprocessing.util.register_after_fork(self, HangingHelpers.after_fork)

    def after_fork(self) -> None:
        for marker in self.markers:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            time.sleep(3600)


def test_a_helper_hung_in_its_fork_is_killed_and_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(workers_module, "HELPER_HELLO_S", 1.0)
    hanging = HangingHelpers(tmp_path, hangs=1)
    try:
        loader = DataLoader(Indices(40), batch_size=2, num_workers=2)
        it = iter(loader)
        hung = it.source.spawner_pid()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="adloader.dataloader.workers"), \
                warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            seen = flat(it)
        assert seen == list(range(40))
        assert not [w for w in warned if issubclass(w.category, WorkerDiedWarning)]  # no worker had started
        assert time.monotonic() - started >= 1.0 and "hung at its start" in caplog.text and str(hung) in caplog.text
        assert alive([hung]) == []
    finally:
        del hanging


def test_helpers_that_keep_hanging_fail_the_epoch_with_what_to_do(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers_module, "HELPER_HELLO_S", 0.5)
    monkeypatch.setattr(workers_module, "HUNG_HELPERS", 1)
    hanging = HangingHelpers(tmp_path, hangs=2)
    try:
        loader = DataLoader(Indices(40), batch_size=2, num_workers=2)
        before = {p.pid for p in psutil.Process().children()}
        with pytest.raises(LoaderError, match="hung at its start 2 times.*Python 3.12"):
            list(loader)
        assert alive([p.pid for p in psutil.Process().children() if p.pid not in before]) == []  # both killed
    finally:
        del hanging


def test_no_process_outlives_its_epoch_or_close() -> None:
    loader = DataLoader(Indices(400, delay=0.001), batch_size=2, num_workers=2)
    it = iter(loader)
    deadline = time.monotonic() + 20
    while len(loader.worker_pids()) < 2 and time.monotonic() < deadline:
        next(it)
    pids = loader.worker_pids() + [it.source.spawner_pid()]
    assert len(alive(pids)) == 3
    list(it)  # a non-persistent epoch ends: its processes go
    assert alive(pids) == []
    persistent = DataLoader(Indices(20), batch_size=2, num_workers=2, persistent_workers=True)
    list(persistent)
    deadline = time.monotonic() + 20  # between epochs the pool still grows to its size
    while persistent.running_workers() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    pids = persistent.worker_pids()
    assert len(alive(pids)) == 2
    persistent.close()
    assert alive(pids) == []


# ------------------------------------------------------------------ per-batch seeding


def _augmented_epochs(schedule: dict[int, int], start: int, persistent: bool = False) -> list[list[float]]:
    loader = DataLoader(Augmented(), batch_size=3, shuffle=True, num_workers=start,
                        generator=torch.Generator().manual_seed(42), persistent_workers=persistent and start > 0)
    rows = []
    for _ in range(2):
        for k, batch in enumerate(loader):
            rows += batch.tolist()
            if k in schedule:
                loader.set_num_workers(schedule[k])
    loader.close()
    return rows


def test_augmentation_randomness_is_the_same_whatever_the_pool_did() -> None:
    reference = _augmented_epochs({}, start=0)
    assert _augmented_epochs({}, start=2) == reference
    assert _augmented_epochs({1: 3, 4: 1, 6: 0}, start=1) == reference
    first, second = reference[:24], reference[24:]
    assert sorted(r[0] for r in first) == sorted(r[0] for r in second) == list(range(24))
    assert {r[1] for r in first}.isdisjoint({r[1] for r in second}), "each epoch draws new augmentations"
    assert all(len({r[1], r[2], r[3]}) == 3 for r in reference), "torch, random and numpy draw differently"
    # persistent workers draw the base seed once (as torch), so they get their own, equally stable, stream
    persistent = _augmented_epochs({}, start=2, persistent=True)
    assert _augmented_epochs({2: 1, 5: 3}, start=1, persistent=True) == persistent
    assert {r[1] for r in persistent[:24]}.isdisjoint({r[1] for r in persistent[24:]})


def test_loading_in_process_leaves_the_trainers_rng_alone() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    list(DataLoader(Augmented(), batch_size=4, num_workers=0, generator=torch.Generator()))
    after = (torch.rand(()).item(), random.random(), float(np.random.rand()))
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    assert after == (torch.rand(()).item(), random.random(), float(np.random.rand()))


# ------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("with_generator", [True, False])
def test_state_dict_mid_epoch_resumes_with_the_next_unseen_batch(persistent: bool, with_generator: bool) -> None:
    def make(workers: int) -> DataLoader:
        torch.manual_seed(5)
        generator = torch.Generator().manual_seed(5) if with_generator else None
        return DataLoader(Augmented(), batch_size=5, shuffle=True, num_workers=workers, generator=generator,
                          persistent_workers=persistent)

    reference = make(2)
    full = [lists(reference) for _ in range(2)]
    reference.close()

    loader = make(2)
    first_epoch = lists(loader)
    it = iter(loader)
    head = [next(it).view(-1).tolist() for _ in range(2)]
    state = loader.state_dict()
    loader.close()

    resumed = make(1)  # another worker count, as a restarted job may have
    resumed.load_state_dict(state)
    tail = lists(resumed)
    resumed.close()
    assert [first_epoch, head + tail] == full


def test_state_dict_between_epochs_continues_with_the_next_epoch() -> None:
    def make() -> DataLoader:
        return DataLoader(Indices(17), batch_size=4, shuffle=True, num_workers=1,
                          generator=torch.Generator().manual_seed(9))

    reference = make()
    epochs = [lists(reference) for _ in range(3)]
    loader = make()
    lists(loader)
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert [lists(resumed), lists(resumed)] == epochs[1:]


def test_iterable_state_dict_resumes_the_same_stream() -> None:
    loader = DataLoader(Shards(40), batch_size=3, num_workers=2)
    full = lists(loader)
    it = iter(loader)
    head = [next(it).view(-1).tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    resumed = DataLoader(Shards(40), batch_size=3, num_workers=3)
    resumed.load_state_dict(state)
    assert head + lists(resumed) == full


def test_load_state_dict_rejects_foreign_states() -> None:
    loader = DataLoader(Indices(8))
    with pytest.raises(BadLoaderState, match="version"):
        loader.load_state_dict({"sampler_iter_yielded": 3})
    with pytest.raises(BadLoaderState, match="lacks"):
        loader.load_state_dict({"version": 1, "epochs_started": 1, "in_epoch": True})


# ------------------------------------------------------------------ iterable datasets resize at epoch boundaries


def test_iterable_resize_applies_at_the_next_epoch_with_exact_shards() -> None:
    loader = DataLoader(Shards(40), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    seen = flat([next(it)])
    loader.set_num_workers(3)
    seen += flat(it)
    assert sorted(seen) == list(range(40))
    assert lists(loader) == lists(torch.utils.data.DataLoader(Shards(40), batch_size=4, num_workers=3))
    assert loader.running_workers() == 3
    loader.close()


# ------------------------------------------------------------------ measurement


def test_counters_measure_batches_samples_worker_cpu_and_disk_reads(tmp_path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(1 << 20))

    class ReadsFromDisk(Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> torch.Tensor:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # this file only: its pages leave the cache
                data = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
            sum(range(20000))  # some CPU
            time.sleep(0.01)  # and some waiting, which only the loading time counts
            return torch.tensor([i, len(data)])

    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    loader = DataLoader(ReadsFromDisk(), batch_size=2, num_workers=2)
    assert [r[1] for r in torch.cat(list(loader)).tolist()] == [1 << 20] * 8
    counters = loader.counters
    assert counters.batches == 4 and counters.samples == 8
    assert counters.worker_cpu_s > 0 and counters.data_wait_s > 0
    assert counters.read_bytes >= 4 << 20, "read_bytes counts what came from storage"
    assert counters.load_s >= 8 * 0.01, "load_s counts the workers' wall time loading, sleeps included"


def test_step_timer_splits_wait_from_compute() -> None:
    now = [0.0]
    counters = LoaderCounters()
    timer = StepTimer(counters, clock=lambda: now[0])
    for wait, compute in [(0.5, 2.0), (0.25, 1.0)]:
        timer.enter()
        now[0] += wait
        timer.leave(delivered=True)
        now[0] += compute
    timer.enter()
    timer.leave(delivered=False)  # the epoch ends: the gap before the next one is not a step
    now[0] += 100
    timer.enter()
    assert (counters.data_wait_s, counters.compute_s) == (0.75, 3.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the CUDA-event step timer times GPU work")
def test_with_cuda_the_wait_is_the_gpus_idle_time_not_the_cpus() -> None:
    """On a GPU, the training loop queues its kernels and returns at once, so the wall clock
    would call the whole loading time a wait. Each step here queues about 40 ms of GPU work
    (timed by events of its own) and loads a batch in 60 ms: the GPU idles about 20 ms a step."""
    torch.cuda.init()
    torch.cuda._sleep(200_000_000)  # clocks up before the work is sized
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles_per_ms = 20_000_000 / start.elapsed_time(end)
    steps, load_s = 12, 0.06
    kernels = []
    loader = DataLoader(Indices(steps, delay=load_s), batch_size=1, num_workers=0)
    for _ in loader:
        kernel = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        kernel[0].record()
        torch.cuda._sleep(int(40.0 * cycles_per_ms))
        kernel[1].record()
        kernels.append(kernel)
    torch.cuda.synchronize()
    list(zip(range(1), loader))  # the next epoch's first step harvests the last step's events
    gpu_ms = sum(a.elapsed_time(b) for a, b in kernels) / steps
    wait_ms, compute_ms = 1000 * loader.counters.data_wait_s / steps, 1000 * loader.counters.compute_s / steps
    detail = f"GPU work {gpu_ms:.1f} ms, counted compute {compute_ms:.1f} ms and wait {wait_ms:.1f} ms a step"
    assert 0.8 * gpu_ms < compute_ms < 1.2 * gpu_ms + 2.0, detail
    assert wait_ms < 1000 * load_s - 0.5 * gpu_ms, f"the CUDA timer counted CPU loading as GPU idle: {detail}"
