"""A CPU-heavy image dataset for the benchmarks: real JPEG files on disk, decoded and augmented per sample.

    root = make_jpeg_cache("bench/cache", px=256, count=2000)   # generated once, reused afterwards
    dataset = JpegFolder(root)                                   # map-style: (3xCxC float tensor, label)

Each sample is what an ImageNet-style training input pipeline does, with
Pillow, numpy and torch only (no torchvision): decode the JPEG, take a random
square crop of 7/8 of the shorter side, flip it horizontally half the time,
convert to float and normalise with the ImageNet mean and standard deviation.
The randomness comes from torch's RNG, so adloader's per-batch seeding makes
the samples reproducible. Used by bench/loader.py and the node benchmark.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
COMPLETE = ".complete"


def make_jpeg_cache(root: str | os.PathLike[str], px: int, count: int, seed: int = 0, quality: int = 90) -> Path:
    """Write ``count`` JPEG images of ``px`` x ``px`` under ``root``/jpeg-<px>-<count>-s<seed> once; later
    calls reuse them (a ``.complete`` marker is written last, so an interrupted run starts over).
    Images are smooth random colour fields plus noise: they compress and decode like photographs,
    not like flat colour. Returns the directory."""
    directory = Path(root) / f"jpeg-{px}-{count}-s{seed}"
    if (directory / COMPLETE).exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coarse = max(2, px // 16)
    for index in range(count):
        field = rng.integers(0, 256, (coarse, coarse, 3), dtype=np.uint8)
        image = np.asarray(Image.fromarray(field).resize((px, px), Image.BICUBIC), dtype=np.float32)
        image += rng.normal(0.0, 12.0, image.shape).astype(np.float32)
        path = directory / f"{index:06d}.jpg"
        partial = path.with_suffix(".tmp")
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(partial, format="JPEG", quality=quality)
        partial.rename(path)
    (directory / COMPLETE).write_text(f"{count} JPEG images of {px}x{px}, seed {seed}\n")
    return directory


class JpegFolder(Dataset):
    """The JPEG files of a directory (sorted by name) as augmented float tensors; label = index % classes.

    ``crop``: side of the random square crop (default 7/8 of each image's shorter side)."""

    def __init__(self, root: str | os.PathLike[str], crop: int | None = None, classes: int = 10) -> None:
        self.files = sorted(str(p) for p in Path(root).glob("*.jpg"))
        if not self.files:
            raise FileNotFoundError(f"no .jpg files under {root}: create them with bench.datasets.make_jpeg_cache")
        self.crop = crop
        self.classes = classes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[index]) as image:
            image = image.convert("RGB")
            width, height = image.size
            side = min(self.crop or (min(width, height) * 7) // 8, width, height)
            left = int(torch.randint(0, width - side + 1, ()))
            top = int(torch.randint(0, height - side + 1, ()))
            image = image.crop((left, top, left + side, top + side))
            if torch.rand(()) < 0.5:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
            pixels = np.array(image, dtype=np.uint8)
        tensor = torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255.0)
        return (tensor - MEAN) / STD, index % self.classes


class Phased(Dataset):
    """``dataset`` whose samples are each loaded ``first_cost`` times until wall time
    ``from_wall_s`` and ``cost`` times from then on: a job that changes phase mid-run."""

    def __init__(self, dataset: Dataset, from_wall_s: float, cost: int, first_cost: int = 1) -> None:
        self.dataset = dataset
        self.from_wall_s = from_wall_s
        self.cost = cost
        self.first_cost = first_cost

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        item = self.dataset[index]
        for _ in range((self.cost if time.time() >= self.from_wall_s else self.first_cost) - 1):
            item = self.dataset[index]
        return item
