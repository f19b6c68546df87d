"""How a batch travels from a worker to the training process.

torch moves every tensor through shared memory: the worker pickles a file
descriptor, and the receiver connects back to the worker (an authenticated
Unix socket round trip) to fetch it while unpickling. For large tensors that
saves a copy; for small ones the round trip costs far more than the bytes
(about 0.1-0.3 ms per tensor, the whole cost of an overhead-bound loader).
So plain CPU tensors of at most ``SMALL_TENSOR_BYTES`` travel by value, inside
the message; everything else goes torch's way (``ForkingPickler`` with
torch's reducers), unchanged.
"""
from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor

SMALL_TENSOR_BYTES = 64 * 1024


def _rebuild_small_tensor(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)  # frombuffer refuses an empty buffer
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _reduce_tensor(tensor: torch.Tensor) -> tuple:
    if (
        type(tensor) is torch.Tensor and tensor.device.type == "cpu" and tensor.layout == torch.strided
        and not tensor.requires_grad and not tensor.is_quantized and not tensor.is_conj() and not tensor.is_neg()
        and tensor.is_contiguous() and tensor.numel() * tensor.element_size() <= SMALL_TENSOR_BYTES
    ):
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        return _rebuild_small_tensor, (raw, tensor.dtype, tuple(tensor.shape))
    return reduce_tensor(tensor)


class BatchPickler(ForkingPickler):
    """torch's ForkingPickler, except that small plain tensors are pickled by value."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.dispatch_table[torch.Tensor] = _reduce_tensor


def dumps(obj: Any) -> memoryview:
    """Pickle a batch for the training process (which reads it with ForkingPickler.loads)."""
    return BatchPickler.dumps(obj)
