"""A plain PyTorch training loop that knows nothing of adloader (tests/test_autoload.py runs it unchanged
under ``adloader run``). It trains until ``--stop-file`` exists, then writes ``--out``: the class of the
loader it built, the worker counts it saw while training, and the samples it loaded."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        x = torch.tensor([float(i % 7), 1.0])
        return x, x.sum(dim=0, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--unordered", action="store_true",
                        help="in_order=False: a loader adloader cannot run, so it stays torch's")
    args = parser.parse_args()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    options = {"in_order": False} if args.unordered else {}
    loader = DataLoader(Numbers(), batch_size=8, shuffle=True, num_workers=1, **options)
    workers_seen, samples = set(), 0
    while not Path(args.stop_file).exists():
        for x, y in loader:
            workers_seen.add(loader.num_workers)
            samples += len(x)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            if Path(args.stop_file).exists():
                break
    Path(args.out).write_text(json.dumps({
        "pid": os.getpid(), "loader_class": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "workers_seen": sorted(workers_seen), "samples": samples,
    }))


if __name__ == "__main__":
    main()
