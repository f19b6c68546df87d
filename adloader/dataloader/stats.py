"""What the loader measures: cumulative counters, per-step timing, worker CPU and reads, resize latency.

Counters are cumulative since the loader was created (the controller diffs
them, so a lost report loses nothing). Each counter has one writer: the
training thread writes the step counters, the dispatcher thread the worker
counters, so no lock is needed; a reader may see a report a batch old.

Worker CPU seconds and read bytes are measured *by each worker about itself*
and sent with every batch: ``time.process_time()`` deltas and the
``read_bytes`` field of ``/proc/self/io``; so is the wall time it spent loading
its batches (``load_s``): summed over a window and divided by it, the batches
being loaded at once, which is what a reader's worker count is sized by. ``read_bytes`` counts bytes the
process caused to be fetched from storage; page-cache hits do not count (they
show only in ``rchar``), so a dataset that fits in the page cache reads ~0
bytes per sample after the first epoch. That is the quantity the controller
needs: bandwidth actually asked of the disk.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Protocol

from adloader.dataloader.messages import Usage


@dataclass
class LoaderCounters:
    """Cumulative counters of one loader (or, summed, of one process)."""

    batches: int = 0
    samples: int = 0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    worker_cpu_s: float = 0.0
    read_bytes: int = 0
    load_s: float = 0.0

    def __add__(self, other: "LoaderCounters") -> "LoaderCounters":
        return LoaderCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def copy(self) -> "LoaderCounters":
        return LoaderCounters(**{f.name: getattr(self, f.name) for f in fields(self)})

    def add_usage(self, usage: Usage) -> None:
        """Count a worker's (or the training thread's) CPU seconds, read bytes and loading time."""
        self.worker_cpu_s += usage.cpu_s
        self.read_bytes += usage.read_bytes
        self.load_s += usage.load_s


class ResizeLatencies:
    """Seconds from each ``set_num_workers`` that added a worker to that worker's first batch.

    Appends to ``out`` (the loader's list, read by ``resize_latencies()``). Workers are named by the
    pool's token for them; the owner serialises calls."""

    def __init__(self, out: list[float], clock: Callable[[], float] = time.monotonic) -> None:
        self._out = out
        self._clock = clock
        self._asked_at: float | None = None  # a grow was asked for and not yet acted on
        self._waiting: dict[int, float] = {}  # token -> when its grow was asked for

    def grow_asked(self) -> None:
        self._asked_at = self._clock()

    def started(self, token: int) -> None:
        """A worker was started; it counts if a grow asked for it."""
        if self._asked_at is not None:
            self._waiting[token] = self._asked_at

    def acted_on(self) -> None:
        """Every worker the last grow asked for has been started (or could not be)."""
        self._asked_at = None

    def first_result(self, token: int) -> None:
        """A worker delivered a batch; only its first one after being asked for is timed."""
        asked_at = self._waiting.pop(token, None)
        if asked_at is not None:
            self._out.append(self._clock() - asked_at)

    def forget(self, token: int) -> None:
        self._waiting.pop(token, None)


class ResourceMeter:
    """CPU seconds and storage read bytes since the previous call, of this process (in a worker) or of
    this thread only (``scope="thread-self"``, for batches loaded in the training process)."""

    def __init__(self, proc_root: str | Path = "/proc", scope: str = "self") -> None:
        self._io_path = Path(proc_root) / scope / "io"
        self._cpu_clock = time.thread_time if scope == "thread-self" else time.process_time
        self._cpu = self._cpu_clock()
        self._read = 0
        self._read = self._read_bytes()

    def delta(self, load_s: float = 0.0) -> Usage:
        """Usage since the previous call; ``load_s``: the wall seconds of it the caller timed loading."""
        cpu = self._cpu_clock()
        read = self._read_bytes()
        delta = Usage(cpu_s=max(0.0, cpu - self._cpu), read_bytes=max(0, read - self._read), load_s=load_s)
        self._cpu, self._read = cpu, read
        return delta

    def _read_bytes(self) -> int:
        try:
            with open(self._io_path, "rb") as f:
                for line in f:
                    if line.startswith(b"read_bytes:"):
                        return int(line.split()[1])
        except OSError:
            pass  # no /proc (or no permission): report no reads rather than fail the batch
        return self._read


class StepEvent(Protocol):
    """A marker on a device's timeline, as ``torch.cuda.Event(enable_timing=True)`` is."""

    def query(self) -> bool:
        """Whether the device has reached the marker (never blocks)."""

    def elapsed_time(self, end: "StepEvent") -> float:
        """Milliseconds of the device's timeline from this marker to ``end`` (both reached)."""

    def synchronize(self) -> None:
        """Block until the device reaches the marker."""


class StepEvents(Protocol):
    """Where the step timer's device markers come from: CUDA's (:class:`CudaEvents`) in a job, an
    emulated device's in ``python -m bench.gpu --dry-run``."""

    def in_use(self) -> bool:
        """Whether this process computes on the device (only then is its timeline the truth)."""

    def record(self) -> StepEvent:
        """A marker recorded now on the current stream."""


class CudaEvents:
    """CUDA events on the current stream. In use once this process has initialised CUDA itself:
    the timer never initialises it (a CPU job, or the controller, must not grab a GPU context)."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda

    def in_use(self) -> bool:
        try:
            return bool(self._cuda.is_initialized())
        except Exception:  # noqa: BLE001 - a broken CUDA install must not break data loading
            return False

    def record(self) -> StepEvent:
        event = self._cuda.Event(enable_timing=True)
        event.record()
        return event


@dataclass
class StepTimer:
    """Splits each step into data wait (blocked in ``__next__``) and compute (between calls).

    On the CPU the wall clock is the truth. Once the process computes on a device
    (``events.in_use()``: it initialised CUDA), the time between ``__next__`` calls is only the
    time Python took to queue kernels, and a wait in ``__next__`` may be hidden behind kernels
    still running; from the next step on the split is read from the device's timeline instead
    (:class:`DeviceStepTimer`), with no synchronisation. The step in flight when the switch
    happens is not counted. ``clock`` and ``events`` are injectable for tests."""

    counters: LoaderCounters
    clock: Callable[[], float] = time.perf_counter
    events: StepEvents | None = None
    _entered: float = 0.0
    _left: float | None = None
    _device: "DeviceStepTimer | None" = None

    def enter(self) -> None:
        """Called when ``__next__`` starts."""
        if self._device is None and self.events is not None and self.events.in_use():
            self._device = DeviceStepTimer(self.counters, self.events)
        if self._device is not None:
            self._device.enter()
            return
        now = self.clock()
        if self._left is not None:
            self.counters.compute_s += now - self._left
        self._entered = now

    def leave(self, delivered: bool) -> None:
        """Called when ``__next__`` returns a batch (``delivered``) or ends the epoch."""
        if self._device is not None:
            self._device.leave(delivered)
            return
        now = self.clock()
        if delivered:
            self.counters.data_wait_s += now - self._entered
            self._left = now
        else:
            self._left = None  # the gap to the next epoch is not a training step

    def settle(self) -> None:
        """Count every step whose markers are recorded, waiting for the device to reach them.
        Blocks: for the end of a measurement, never per step. Nothing to do on the wall clock."""
        if self._device is not None:
            self._device.settle()

    @property
    def on_device(self) -> bool:
        """Whether the split is read from the device's timeline."""
        return self._device is not None


class DeviceStepTimer:
    """GPU starvation from device markers, read a step later so nothing forces a sync.

    Marker A is recorded on the current stream when ``__next__`` starts, marker B when it
    returns. The device passes A when it has finished the work queued before the wait, and
    B once the CPU has the batch and queues more; so elapsed(A, B) is the time the device sat
    idle for data (zero when the wait was hidden behind queued kernels), and elapsed(B, next A)
    is the step's compute. Steps whose markers the device has passed are counted with
    ``query()`` on later steps; the pending ones are at most the device's queue deep."""

    def __init__(self, counters: LoaderCounters, events: StepEvents) -> None:
        self.counters = counters
        self._events = events
        self._pending: deque[tuple[StepEvent, StepEvent, StepEvent]] = deque()
        self._current: list[StepEvent] = []

    def enter(self) -> None:
        marker = self._events.record()
        if len(self._current) == 2:  # [A, B] of the previous step: its compute ends at this A
            self._pending.append((self._current[0], self._current[1], marker))
        self._current = [marker]
        self._harvest(wait=False)

    def leave(self, delivered: bool) -> None:
        if delivered:
            self._current.append(self._events.record())
        else:
            self._current = []  # the gap to the next epoch is not a training step

    def settle(self) -> None:
        self._harvest(wait=True)

    def _harvest(self, wait: bool) -> None:
        while self._pending:
            start, got, end = self._pending[0]
            if wait:
                end.synchronize()
            elif not end.query():
                return
            self._pending.popleft()
            self.counters.data_wait_s += start.elapsed_time(got) / 1000.0
            self.counters.compute_s += got.elapsed_time(end) / 1000.0


def make_step_timer(counters: LoaderCounters, events: StepEvents | None = None) -> StepTimer:
    """The loader's step timer: the wall clock, and CUDA's timeline (or ``events``') once this
    process computes on the device."""
    if events is None:
        try:
            events = CudaEvents()
        except Exception:  # noqa: BLE001 - no usable torch.cuda: the wall clock alone
            events = None
    return StepTimer(counters, events=events)
