"""A plain ``torchrun --nproc-per-node 2`` DDP training script over a folder of JPEG files.

What a user writes, unchanged: torch's DataLoader with a DistributedSampler, Pillow to decode,
torch ops to resize and normalise (no torchvision), a small CNN in DistributedDataParallel
over gloo. Each rank writes its record (training_record.py) under ``--out``.

    torchrun --nproc-per-node 2 tests/programs/torchrun_jpeg.py --data DIR --out DIR --epochs 2
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from training_record import RankRecord, program_arguments, stop_requested

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
CLASSES = 4


class JpegFolder(Dataset):
    """The ``*.jpg`` files of a directory, sorted: (image resized to ``px`` and normalised, label, index)."""

    def __init__(self, root: str, px: int) -> None:
        self.files = sorted(str(p) for p in Path(root).glob("*.jpg"))
        self.px = px

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        with Image.open(self.files[index]) as image:
            pixels = np.asarray(image.convert("RGB"))
        x = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float().div_(255.0)
        x = F.interpolate(x[None], size=(self.px, self.px), mode="bilinear", align_corners=False)[0]
        return (x - MEAN) / STD, index % CLASSES, index


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(8, CLASSES),
    )


def main() -> None:
    parser = program_arguments(samples=False)
    parser.add_argument("--data", required=True, help="a folder of .jpg files")
    parser.add_argument("--px", type=int, default=32, help="side the images are resized to")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = JpegFolder(args.data, args.px)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers)
    net = DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    record = RankRecord(rank, world)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        record.epoch()
        for x, y, index in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            record.step(loader, index.tolist(), loss.item())
        stop = torch.tensor(float(stop_requested(args.stop_file)))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
    record.write(args.out)
    dist.barrier()  # gloo can abort a rank that tears down while its peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
