"""Per-batch seeding: the same seed gives the same samples however the worker pool was resized.

torch's loader seeds each *worker* once (``base_seed + worker_id``), so which
random crop a sample gets depends on which worker happened to load it. Here
every batch is seeded on its own before it is fetched:

    seed(epoch e, batch k) = SeedSequence([base_seed, e, k]).generate_state(4)  (numpy's SeedSequence)

``random`` gets the full 128 bits, ``torch`` the first 64, ``numpy.random``
the four 32-bit words. ``base_seed`` is drawn from the loader's ``generator``
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


def batch_seed(base_seed: int, epoch: int, batch: int) -> int:
    """The 128-bit seed of batch ``batch`` of epoch ``epoch`` (a pure function)."""
    words = np.random.SeedSequence([base_seed & MASK64, epoch, batch]).generate_state(4, np.uint32)
    return int(words[0]) | int(words[1]) << 32 | int(words[2]) << 64 | int(words[3]) << 96


def seed_all(seed: int) -> None:
    """Seed ``random``, torch's CPU generator and ``numpy.random`` of this process from one seed."""
    random.seed(seed)
    torch.default_generator.manual_seed(seed & MASK64)  # torch.manual_seed also reseeds every device: ~100x slower
    np.random.seed([(seed >> shift) & 0xFFFFFFFF for shift in (0, 32, 64, 96)])


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
