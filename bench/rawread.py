"""Raw samples read from disk with O_DIRECT: the benchmark's job bound by reads.

Each sample is one file of px·px·3 uint8 bytes (RGB), padded to 4 KiB. Reads use
O_DIRECT into a page-aligned buffer, so they always reach the block device (the
page cache never serves them) and the cgroup read throttle (blkio / io.max) is
what bounds the job. The CPU work per sample is small on purpose: a random crop,
a flip and a 4x subsampling (as a job that reads large raw records and keeps a
small part of each), so the job's reads, not its cores, set its speed.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from adloader.errors import AdloaderError

ALIGN = 4096
SUBSAMPLE = 4


class RawDataError(AdloaderError):
    """The raw-sample cache is missing or damaged; the message says how to rebuild it."""


def make_raw_cache(root: str | os.PathLike[str], px: int, count: int, seed: int = 0) -> Path:
    """Write ``count`` raw samples of side ``px`` under ``root``/raw-<px>-<count> once
    (fsynced, so O_DIRECT reads see them); later calls reuse them. Returns the directory."""
    directory = Path(root) / f"raw-{px}-{count}"
    done = directory / ".complete"
    if done.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    size = px * px * 3
    padded = -(-size // ALIGN) * ALIGN
    for index in range(count):
        data = np.zeros(padded, dtype=np.uint8)
        data[:size] = rng.integers(0, 256, size, dtype=np.uint8)
        path = directory / f"{index:06d}.raw"
        with open(path, "wb") as handle:
            handle.write(data.tobytes())
            handle.flush()
            os.fsync(handle.fileno())
    done.write_text(f"{count} samples of {px}x{px}x3\n")
    return directory


class RawFolder(Dataset):
    """Samples of a :func:`make_raw_cache` directory as uint8 CHW tensors, randomly
    cropped to ``crop``, flipped and subsampled. Every read bypasses the page cache."""

    def __init__(self, root: str | os.PathLike[str], px: int, crop: int | None = None) -> None:
        self.files = sorted(str(p) for p in Path(root).glob("*.raw"))
        if not self.files:
            raise RawDataError(f"no raw samples under {root}: create them with bench.rawread.make_raw_cache")
        self.px = px
        self.crop = crop or (px * 7) // 8
        self.size = px * px * 3
        self.padded = -(-self.size // ALIGN) * ALIGN
        self._buffer: mmap.mmap | None = None  # per process: made on first read, never pickled

    def __len__(self) -> int:
        return len(self.files)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_buffer": None}

    def __getitem__(self, index: int) -> torch.Tensor:
        if self._buffer is None:
            self._buffer = mmap.mmap(-1, self.padded)  # page-aligned, as O_DIRECT requires
        fd = os.open(self.files[index], os.O_RDONLY | os.O_DIRECT)
        try:
            got = os.preadv(fd, [self._buffer], 0)
        finally:
            os.close(fd)
        if got < self.size:
            raise RawDataError(f"{self.files[index]}: short read ({got} of {self.size} bytes); regenerate the cache")
        image = np.frombuffer(self._buffer, dtype=np.uint8, count=self.size).reshape(self.px, self.px, 3)
        # torch's RNG, so the loader's per-batch seeding makes samples reproducible
        top = int(torch.randint(0, self.px - self.crop + 1, ()))
        left = int(torch.randint(0, self.px - self.crop + 1, ()))
        patch = image[top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            patch = patch[:, ::-1]
        small = patch[::SUBSAMPLE, ::SUBSAMPLE]
        return torch.from_numpy(np.ascontiguousarray(small.transpose(2, 0, 1)))
