"""Property: whatever sequence of resizes and worker kills happens mid-epoch, a map-style epoch
delivers every batch exactly once, in the sampler's order. Real workers, real SIGKILLs."""
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
    """Slow enough that batches are in flight when a resize or a kill lands."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.0015)
        return torch.tensor([i])


resize = st.tuples(st.just("resize"), st.integers(0, 3))
kill = st.tuples(st.just("kill"), st.integers(0, 7))  # which live worker (modulo their number)
# At most two kills per run: a batch is given up only after POISON_DEATHS (3) deaths, and one kill
# can strike a given batch at most once, so no schedule here can legitimately end in a poison error.
schedules = st.lists(st.tuples(st.integers(0, STEPS - 1), st.one_of(resize, resize, kill)), max_size=6).filter(
    lambda events: sum(1 for _, (kind, _) in events if kind == "kill") <= 2
)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.integers(0, 3), shuffle=st.booleans(), events=schedules)
def test_any_resize_and_kill_schedule_delivers_every_batch_once_in_order(start, shuffle, events) -> None:
    expected = torch.utils.data.DataLoader(Slow(), batch_size=BATCH, shuffle=shuffle,
                                           generator=torch.Generator().manual_seed(1))
    expected_batches = [b.view(-1).tolist() for b in expected]
    loader = DataLoader(Slow(), batch_size=BATCH, shuffle=shuffle, num_workers=start,
                        generator=torch.Generator().manual_seed(1))
    by_step: dict[int, list[tuple[str, int]]] = {}
    for step, event in events:
        by_step.setdefault(step, []).append(event)
    delivered = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerDiedWarning)
            for step, batch in enumerate(loader):
                delivered.append(batch.view(-1).tolist())
                for kind, value in by_step.get(step, []):
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
