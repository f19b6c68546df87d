"""A small training script for end-to-end tests of adloader.DataLoader under ``adloader run``.

It changes nothing but the import (``from adloader import DataLoader``), loads
a map-style dataset that does some CPU work per sample, "computes" each step by
sleeping (GPU-emulated), and runs whole epochs until ``--seconds`` have passed.
Under torchrun (``--distributed``) it joins a gloo process group and shards the
data with DistributedSampler. It stops at an epoch boundary once ``--seconds``
have passed or ``--stop-file`` exists. At the end each rank writes ``rank<N>.json`` into
``--out``: the indices it saw per epoch, its final worker setting, the worker
pids it ran and its loader counters.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from adloader import DataLoader


_BALLAST: list[bytearray] = []


class Work(Dataset):
    def __init__(self, n: int, worker_mb: int = 0, work: int = 3000) -> None:
        self.n = n
        self.worker_mb = worker_mb
        self.work = work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.worker_mb and not _BALLAST and torch.utils.data.get_worker_info() is not None:
            ballast = bytearray(self.worker_mb << 20)
            ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))  # touch every page: private memory
            _BALLAST.append(ballast)
        sum(range(self.work))  # CPU per sample
        return torch.tensor([i])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--work", type=int, default=3000, help="CPU per sample: sum(range(WORK))")
    parser.add_argument("--compute-s", type=float, default=0.01, help="emulated GPU time per step")
    parser.add_argument("--seconds", type=float, default=5.0, help="run whole epochs for this long at most")
    parser.add_argument("--stop-file", type=Path, default=None,
                        help="stop after the epoch during which this file appears (tests set --seconds high)")
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--worker-mb", type=int, default=0, help="each worker holds this much private memory")
    parser.add_argument("--describe", action="store_true",
                        help="call adloader.describe_model on a small MLP first (its features go with the reports)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    sampler = None
    rank = 0
    if args.distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        total = torch.tensor([1])
        dist.all_reduce(total)
        assert int(total) == dist.get_world_size()
        sampler = torch.utils.data.distributed.DistributedSampler(Work(args.samples, work=args.work), shuffle=True,
                                                                  seed=3)
    if args.describe:
        import adloader

        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        adloader.describe_model(model, torch.zeros(args.batch_size, 64))
    loader = DataLoader(Work(args.samples, args.worker_mb, args.work), batch_size=args.batch_size,
                        num_workers=args.workers, sampler=sampler,
                        persistent_workers=args.workers > 0)
    epochs, pids = [], set()
    deadline = time.monotonic() + args.seconds
    while not epochs or (time.monotonic() < deadline and not (args.stop_file and args.stop_file.exists())):
        if sampler is not None:
            sampler.set_epoch(len(epochs))
        seen = []
        for batch in loader:
            seen += batch.view(-1).tolist()
            pids.update(loader.worker_pids())
            time.sleep(args.compute_s)
        epochs.append(seen)
    result = {
        "rank": rank, "epochs": epochs, "num_workers": loader.num_workers, "running": loader.running_workers(),
        "worker_pids": sorted(pids), "counters": dataclasses.asdict(loader.counters), "pid": os.getpid(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    loader.close()
    if args.distributed:
        torch.distributed.barrier()  # gloo can abort a rank that tears down while its peer still talks to it
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
