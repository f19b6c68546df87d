"""Live worker resizes while the device trains, with ``pin_memory=True``.

One epoch of a map-style dataset whose sample i carries i; the training loop moves each
batch to the device and queues a step, while the worker count is changed between steps on
a schedule that grows and shrinks it. Checked: every sample arrives exactly once, every batch
came in pinned memory (on CUDA, where pinning means something), and how long each grow took
to deliver its first batch (``DataLoader.resize_latencies``).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from adloader import DataLoader
from bench.gpu_check.device import CheckDevice, training_step

SCHEDULE = (1, 3, 1, 4, 2)
"""Worker counts in turn, each for an equal share of the epoch."""


class Numbered(torch.utils.data.Dataset):
    """Sample i: (i, a 3x32x32 image), after ``delay`` seconds of loading."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        time.sleep(self.delay)
        return index, torch.rand(3, 32, 32)


def run(device: CheckDevice, samples: int, batch: int = 8, load_ms: float = 4.0, progress=print) -> dict[str, Any]:
    pin = device.torch_device == "cuda"
    loader = DataLoader(Numbered(samples, load_ms / 1000.0), batch_size=batch, shuffle=True, num_workers=SCHEDULE[0],
                        pin_memory=pin)
    if device.emulated:
        loader.step_events = device.events
    step = training_step(device, emulated_ms=5.0)
    seen: list[int] = []
    unpinned = 0
    batches = -(-samples // batch)
    share = -(-batches // len(SCHEDULE))
    resizes = []
    try:
        for index, (numbers, images) in enumerate(loader):
            if index and index % share == 0 and index // share < len(SCHEDULE):
                target = SCHEDULE[index // share]
                loader.set_num_workers(target)
                resizes.append({"at_batch": index, "workers": target})
            if pin and not images.is_pinned():
                unpinned += 1
            seen.extend(numbers.tolist())
            step(images)
        device.synchronize()
        latencies = loader.resize_latencies()
    finally:
        loader.close()
    exactly_once = sorted(seen) == list(range(samples))
    progress(f"  resizes {SCHEDULE}: {len(seen)} samples, exactly once: {exactly_once}, "
             f"grow latencies {[round(s, 3) for s in latencies]} s")
    return {"exactly_once": exactly_once, "samples": samples, "delivered": len(seen),
            "duplicates": len(seen) - len(set(seen)), "missing": samples - len(set(seen)),
            "pin_memory": pin, "unpinned_batches": unpinned if pin else None, "schedule": list(SCHEDULE),
            "resizes": resizes, "resize_latency_s": latencies,
            "resize_latency_median_s": statistics.median(latencies) if latencies else None,
            "resize_latency_max_s": max(latencies) if latencies else None}
