"""What a worker's death does to the epoch: its batches go to others, the one it was on is blamed.

Why apart: a lost worker is an ordinary event (SIGKILL, the OOM killer, a crash in native code), and
the rules that keep the epoch exact through it are small and must be the same wherever a batch is
lost, whether its worker died or its tensors could not be fetched. A batch blamed ``POISON_DEATHS``
times is given up with an error naming its indices, raised at its turn in the epoch. An iterable
stream cannot move to another worker, so the death of a streaming worker ends the epoch. The caller
holds the dispatcher's lock.
"""
from __future__ import annotations

import os
import signal

from adloader.dataloader.errors import IterableWorkerDied, PoisonBatchError
from adloader.dataloader.table import Batch, Epoch, Outcome
from adloader.dataloader.workers import WORKING, Slot

POISON_DEATHS = 3  # a batch that killed this many workers is given up


def describe_exit(status: int | None) -> str:
    """A worker's wait status in words ("was killed by SIGKILL"); None when its helper died too."""
    if status is None:
        return "exited (status unknown: its helper process died)"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def blame(epoch: Epoch, batch: Batch, how: str) -> None:
    """``batch`` was lost ``how``: load it again, or give it up once it has been lost too often."""
    batch.deaths += 1
    if batch.deaths >= POISON_DEATHS:
        epoch.resolve(batch, Outcome(error=PoisonBatchError(batch.number, batch.payload, batch.deaths, how)))
    else:
        epoch.requeue(batch)


def recover(epoch: Epoch | None, slot: Slot, lost: list[Batch], how: str, streaming: bool) -> str | None:
    """After ``slot``'s worker exited ``how`` holding ``lost`` (oldest first): put the epoch right, and
    return the warning for the training loop (None for a streaming worker: its epoch fails instead)."""
    if epoch is not None and epoch.iterable and streaming:
        if slot.identity.id not in epoch.ended_streams and not epoch.finished:
            epoch.fatal = IterableWorkerDied(
                f"loader worker {slot.identity.id} (pid {slot.pid}) {how} while streaming an IterableDataset; "
                "its position in the stream cannot be recovered, so this epoch ends here"
            )
        return None
    for position, batch in enumerate(lost):
        if position == 0 and slot.state == WORKING:  # workers load in order: the oldest is the one it was on
            blame(epoch, batch, how)
        else:
            epoch.requeue(batch)
    if lost:
        return (
            f"loader worker {slot.identity.id} (pid {slot.pid}) {how}; its unfinished batches "
            f"{[b.number for b in lost]} were given to the other workers"
        )
    return f"loader worker {slot.identity.id} (pid {slot.pid}) {how}; starting a replacement"
