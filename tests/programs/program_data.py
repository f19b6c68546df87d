"""The deterministic map-style datasets of this directory's training programs.

Each sample is a pure function of its index (no shared random state), and each sample carries
its index, so a program can record which samples it received.
"""
from __future__ import annotations

import torch
from torch.utils.data import Dataset


class TokenIds(Dataset):
    """``size`` token-id sequences for a text classifier: a dict of ``input_ids``,
    ``attention_mask``, ``labels`` and ``idx`` (the sample's index), as a tokenised corpus gives."""

    def __init__(self, size: int, seq_len: int = 16, vocab: int = 128) -> None:
        self.size, self.seq_len, self.vocab = size, seq_len, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(1, self.vocab, (self.seq_len,), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "labels": torch.tensor(int(ids[0]) % 2), "idx": torch.tensor(index)}


class Features(Dataset):
    """``size`` regression samples ``(x, y, index)``: ``x`` has ``width`` features computed from
    the index, ``y`` a fixed function of ``x``."""

    def __init__(self, size: int, width: int = 8) -> None:
        self.size, self.width = size, width

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x = torch.sin(torch.arange(self.width, dtype=torch.float32) * (index + 1) * 0.37)
        return x, x.sum(dim=0, keepdim=True).tanh(), index
