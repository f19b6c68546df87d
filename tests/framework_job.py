"""A small training job whose code imports ``adloader.DataLoader`` and runs it through a framework
(tests/test_dataloader_frameworks.py runs it with the substitution off: the explicit path).

``--framework lightning``: a Lightning ``Trainer`` on CPU, ``strategy="ddp"`` with 2 processes over gloo
(Lightning re-creates the loader to inject a DistributedSampler). ``--framework accelerate``: HF
Accelerate's ``prepare()`` through :func:`adloader.dataloader.accelerate.prepare_data_loader`.
Each process trains until ``--stop-file`` exists, then writes ``rank<R>.json``: the class of the loader
it iterated, the worker counts it saw while training, and the samples it loaded.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from adloader import DataLoader
from plain_torch_job import Numbers  # the same data as the unchanged script (tests/ is this script's path)




class Record:
    """What one process saw of the loader it was given by the framework."""

    def __init__(self) -> None:
        self.loader_class = ""
        self.workers_seen: set[int] = set()
        self.samples = 0

    def saw(self, loader: object, batch_size: int) -> None:
        self.loader_class = f"{type(loader).__module__}.{type(loader).__qualname__}"
        self.workers_seen.add(getattr(loader, "num_workers", -1))
        self.samples += batch_size

    def write(self, out: Path, rank: int) -> None:
        (out / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "pid": os.getpid(), "loader_class": self.loader_class,
            "workers_seen": sorted(self.workers_seen), "samples": self.samples,
        }))


def run_lightning(args: argparse.Namespace) -> None:
    import lightning as L

    record = Record()
    stop = Path(args.stop_file)

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, _index):
            x, y = batch
            record.saw(self.trainer.train_dataloader, len(x))
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_train_epoch_end(self) -> None:
            stopping = torch.tensor(float(stop.exists()))
            self.trainer.should_stop = bool(self.trainer.strategy.reduce(stopping, reduce_op="max") > 0)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(Numbers(), batch_size=8, shuffle=True, num_workers=1)

    trainer = L.Trainer(
        accelerator="cpu", strategy="ddp", devices=2, max_epochs=1000, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Model())
    record.write(Path(args.out), trainer.global_rank)


def run_accelerate(args: argparse.Namespace) -> None:
    from accelerate import Accelerator

    from adloader.dataloader.accelerate import prepare_data_loader

    record = Record()
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_data_loader(accelerator, DataLoader(Numbers(), batch_size=8, shuffle=True, num_workers=1))
    while not Path(args.stop_file).exists():
        for x, y in loader:
            record.saw(loader.base_dataloader, len(x))
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            if Path(args.stop_file).exists():
                break
    record.write(Path(args.out), accelerator.process_index)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["lightning", "accelerate"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-file", required=True)
    args = parser.parse_args()
    {"lightning": run_lightning, "accelerate": run_accelerate}[args.framework](args)


if __name__ == "__main__":
    main()
