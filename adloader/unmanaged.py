"""Why this process's DataLoaders are not adloader's, in words, for its reports and ``adloader status``.

A loader that runs as torch's (adloader.dataloader.loader: an option adloader's loader cannot
run, under ``adloader run``'s substitution) records its reason here. The module imports
nothing heavy, so the reporter can read it without torch.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
_reasons: list[str] = []


def note_unmanaged(reason: str) -> bool:
    """Record that a loader of this process runs unmanaged because of ``reason``. True the first
    time anything is recorded in this process (the caller warns then, once)."""
    with _lock:
        first = not _reasons
        if reason not in _reasons:
            _reasons.append(reason)
        return first


def unmanaged_reasons() -> tuple[str, ...]:
    """The distinct reasons recorded in this process, oldest first; empty when every loader is managed."""
    with _lock:
        return tuple(_reasons)
