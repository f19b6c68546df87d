"""A plain Lightning training program: ``strategy="ddp"`` over gloo, 2 CPU processes.

What a user writes, unchanged: a LightningModule whose ``train_dataloader`` returns torch's
DataLoader; Lightning starts rank 1 as a child of rank 0 and rebuilds the loader with a
DistributedSampler. Each rank writes its record (training_record.py) under ``--out``.

    python tests/programs/lightning_ddp.py --out DIR --epochs 2
"""
from __future__ import annotations

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader

from program_data import Features
from training_record import RankRecord, program_arguments, stop_requested


class Regression(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.record: RankRecord | None = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Features(self.args.samples), batch_size=self.args.batch_size, shuffle=True,
                          num_workers=self.args.num_workers)

    def on_train_epoch_start(self) -> None:
        if self.record is None:
            self.record = RankRecord(self.trainer.global_rank, self.trainer.world_size)
        self.record.epoch()

    def training_step(self, batch, _index):
        x, y, index = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.record.step(self.trainer.train_dataloader, index.tolist(), loss.item())
        return loss

    def on_train_epoch_end(self) -> None:
        stop = torch.tensor(float(stop_requested(self.args.stop_file)))
        if self.trainer.strategy.reduce(stop, reduce_op="max") > 0:
            self.trainer.should_stop = True

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    parser = program_arguments()
    args = parser.parse_args()

    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    module = Regression(args)
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=args.epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    module.record.write(args.out)


if __name__ == "__main__":
    main()
