"""Property: whatever sequence of resizes and worker kills happens mid-epoch, a map-style epoch
delivers every batch exactly once, in the sampler's order, under every start method, with persistent
workers on and off, on a dataset holding a tensor. Real workers, real SIGKILLs."""
from __future__ import annotations

import os
import signal
import time
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from adloader import DataLoader
from adloader.dataloader import WorkerDiedWarning

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SAMPLES, BATCH = 64, 2
STEPS = SAMPLES // BATCH


class Slow(Dataset):
    """Holds its samples in a tensor (which spawn/forkserver workers must each receive), and is slow
    enough that batches are in flight when a resize or a kill lands."""

    def __init__(self) -> None:
        self.values = torch.arange(SAMPLES)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.0015)
        return self.values[i:i + 1].clone()


resize = st.tuples(st.just("resize"), st.integers(0, 3))
kill = st.tuples(st.just("kill"), st.integers(0, 7))  # which live worker (modulo their number)
# At most two kills per run: a batch is given up only after POISON_DEATHS (3) deaths, and one kill
# can strike a given batch at most once, so no schedule here can legitimately end in a poison error.
schedules = st.lists(st.tuples(st.integers(0, STEPS - 1), st.one_of(resize, resize, kill)), max_size=6).filter(
    lambda events: sum(1 for _, (kind, _) in events if kind == "kill") <= 2
)
given_a_schedule = given(start=st.integers(0, 3), shuffle=st.booleans(), events=schedules)
# torch accepts a multiprocessing_context only with workers, so these start with at least one.
given_a_schedule_with_workers = given(start=st.integers(1, 3), shuffle=st.booleans(), events=schedules)


def check_schedule(method: str, persistent: bool, start: int, shuffle: bool, events) -> None:
    """Run the events during the first epoch (a second with persistent workers, which keep the resized
    pool) and compare every batch with torch's loader on the same generator."""
    epochs = 2 if persistent else 1
    # torch draws the workers' base seed once with persistent workers, every epoch without: the expected
    # shuffles come from torch's loader set up the same way (forked workers: the batches do not depend on it).
    expected = torch.utils.data.DataLoader(Slow(), batch_size=BATCH, shuffle=shuffle, num_workers=start,
                                           persistent_workers=persistent and start > 0,
                                           generator=torch.Generator().manual_seed(1))
    expected_batches = [b.view(-1).tolist() for _ in range(epochs) for b in expected]
    loader = DataLoader(Slow(), batch_size=BATCH, shuffle=shuffle, num_workers=start,
                        generator=torch.Generator().manual_seed(1),
                        multiprocessing_context=method if start > 0 else None,
                        persistent_workers=persistent and start > 0)
    by_step: dict[int, list[tuple[str, int]]] = {}
    for step, event in events:
        by_step.setdefault(step, []).append(event)
    delivered = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerDiedWarning)
            for epoch in range(epochs):
                for step, batch in enumerate(loader):
                    delivered.append(batch.view(-1).tolist())
                    for kind, value in by_step.get(step, []) if epoch == 0 else []:
                        if kind == "resize":
                            loader.set_num_workers(value)
                        elif pids := loader.worker_pids():
                            try:
                                os.kill(pids[value % len(pids)], signal.SIGKILL)
                            except ProcessLookupError:
                                pass  # it was retiring and has just exited
    finally:
        loader.close()
    assert delivered == expected_batches


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given_a_schedule
def test_any_resize_and_kill_schedule_delivers_every_batch_once_in_order(start, shuffle, events) -> None:
    check_schedule("fork", False, start, shuffle, events)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given_a_schedule
def test_persistent_workers_keep_every_batch_once_in_order_across_epochs(start, shuffle, events) -> None:
    check_schedule("fork", True, start, shuffle, events)


# spawn and forkserver start a helper interpreter per loader (seconds on a loaded 2-core machine), so they
# get one example each; the fork tests above explore the schedules.
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given_a_schedule_with_workers
def test_spawn_and_forkserver_deliver_every_batch_once_in_order(method, persistent, start, shuffle, events) -> None:
    check_schedule(method, persistent, start, shuffle, events)
