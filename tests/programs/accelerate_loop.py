"""A plain HF Accelerate training loop: ``accelerator.prepare(model, optimizer, loader)``.

What a user writes, unchanged: torch's DataLoader over token ids, handed to Accelerate, which
rebuilds it as its own ``DataLoaderShard``; a small bag-of-embeddings classifier. It writes
its record (training_record.py) under ``--out``.

    python tests/programs/accelerate_loop.py --out DIR --epochs 2
"""
from __future__ import annotations


import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from program_data import TokenIds
from training_record import RankRecord, program_arguments, stop_requested


class BagClassifier(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(vocab, 32)
        self.head = torch.nn.Linear(32, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))


def main() -> None:
    parser = program_arguments()
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    dataset = TokenIds(args.samples)
    model = BagClassifier(dataset.vocab)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    record = RankRecord(accelerator.process_index, accelerator.num_processes)
    for _ in range(args.epochs):
        record.epoch()
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            record.step(loader, batch["idx"].tolist(), loss.item())
        if stop_requested(args.stop_file):
            break
    record.write(args.out)


if __name__ == "__main__":
    main()
