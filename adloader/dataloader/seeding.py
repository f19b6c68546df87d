"""Per-batch seeding: the same seed gives the same samples however the worker pool was resized.

torch's loader seeds each *worker* once (``base_seed + worker_id``), so which
random crop a sample gets depends on which worker happened to load it. Here
every batch is seeded on its own before it is fetched:

    words = SeedSequence([base_seed, e, k]).generate_state(10)   (numpy's SeedSequence, 32-bit words)
    random.seed(words 0-3 as one 128-bit int), numpy.random.seed(words 4-7),
    torch's CPU generator .manual_seed(words 8-9 as one int, its top bit cleared)

Disjoint words, so ``random`` and ``numpy`` (both Mersenne Twisters seeded
the same way) do not draw the same numbers. ``base_seed`` is drawn from the loader's ``generator``
(or torch's global RNG) at ``iter()`` exactly as torch draws it, so the
sampler's shuffle, and with it the batch indices, equal torch's. ``e`` counts
the loader's epochs, so persistent workers (torch draws ``base_seed`` once for
them) still get new augmentations every epoch.
"""
from __future__ import annotations

import contextlib
import random
from typing import Iterator

import numpy as np
import torch

MASK64 = (1 << 64) - 1
MASK63 = (1 << 63) - 1
SEED_WORDS = 10


def batch_seed(base_seed: int, epoch: int, batch: int) -> int:
    """The 320-bit seed of batch ``batch`` of epoch ``epoch`` (a pure function); see :func:`seed_all`."""
    words = np.random.SeedSequence([base_seed & MASK64, epoch, batch]).generate_state(SEED_WORDS, np.uint32)
    return sum(int(word) << (32 * i) for i, word in enumerate(words))


def seed_all(seed: int) -> None:
    """Seed ``random``, ``numpy.random`` and torch's CPU generator of this process from disjoint parts of
    one :func:`batch_seed` value (or any int: missing words are zero)."""
    words = [(seed >> (32 * i)) & 0xFFFFFFFF for i in range(SEED_WORDS)]
    random.seed(words[0] | words[1] << 32 | words[2] << 64 | words[3] << 96)
    np.random.seed(words[4:8])
    # 63 bits, as torch's own worker seeds (an int64 draw): torch.initial_seed() must fit in an int64 tensor
    torch.default_generator.manual_seed((words[8] | words[9] << 32) & MASK63)  # torch.manual_seed: 100x slower


def seed_worker(seed: int) -> None:
    """A worker's start, as torch seeds its workers (``base_seed + worker_id``), so a ``worker_init_fn``
    that derives seeds from ``torch.initial_seed()`` sees what it would see under torch."""
    random.seed(seed)
    torch.manual_seed(seed & MASK64)
    np.random.seed(np.random.SeedSequence(seed & MASK64).generate_state(4))


def draw_base_seed(generator: torch.Generator | None) -> int:
    """Draw an epoch's base seed the way torch's ``_BaseDataLoaderIter`` does (one int64 draw)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


@contextlib.contextmanager
def isolated_global_rng() -> Iterator[None]:
    """Run a block with the process's global RNGs saved and restored afterwards.

    Used when a batch is fetched in the training process itself (zero workers):
    the per-batch seed must not disturb the trainer's own random streams."""
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
