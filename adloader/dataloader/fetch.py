"""Turning one task into one batch: the same rules as torch's map/iterable fetchers.

Shared by the worker processes and by in-process loading (zero workers), so a
batch is built identically wherever it is built. Map-style: ``__getitems__``
when the dataset has it, else ``dataset[i]`` for each index, then
``collate_fn``. Iterable: the next ``batch_size`` items of this process's
iterator (an empty or, with ``drop_last``, short batch ends the stream).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass
class FetchSpec:
    """Everything a process needs to build batches; sent to the worker-spawning helper once."""

    dataset: Any
    iterable: bool
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    worker_init_fn: Callable[[int], None] | None


class StreamEnded(Exception):
    """An iterable dataset's stream in this process has no more batches."""


def fetch_map(spec: FetchSpec, indices: Any) -> tuple[Any, int]:
    """Build one batch of a map-style dataset; returns (batch, number of samples)."""
    dataset = spec.dataset
    if spec.auto_collation:
        getitems = getattr(dataset, "__getitems__", None)
        items = getitems(indices) if getitems else [dataset[i] for i in indices]
        return spec.collate_fn(items), len(indices)
    return spec.collate_fn(dataset[indices]), 1


def fetch_iterable(spec: FetchSpec, stream: Iterator[Any], batch_size: int | None) -> tuple[Any, int]:
    """Build the next batch from ``stream``; raises StreamEnded when there is none."""
    if batch_size is None:
        try:
            return spec.collate_fn(next(stream)), 1
        except StopIteration:
            raise StreamEnded() from None
    items = []
    for _ in range(batch_size):
        try:
            items.append(next(stream))
        except StopIteration:
            break
    if not items or (spec.drop_last and len(items) < batch_size):
        raise StreamEnded()
    return spec.collate_fn(items), len(items)
