"""The device the GPU check computes on: a CUDA GPU, or an emulated one for ``--dry-run``.

Both queue work asynchronously, as CUDA does: ``compute(seconds)`` returns at once and the
device works on it afterwards; markers (``record()``) are reached in queue order and time
the device's own timeline. On CUDA the work is a big matmul sized by a calibration and the
markers are CUDA events on the current stream. The emulated device is one thread that runs
the queue: its work is a sleep, its markers the wall clock when the thread reaches them, so
on a CPU-only machine the CPU clock stands in for the GPU's timeline (every result says so).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from adloader.dataloader.stats import CudaEvents, StepEvent, StepEvents
from bench.gpu_check.environment import GpuCheckError


class CheckDevice(Protocol):
    name: str
    emulated: bool
    torch_device: str
    """Where tensors and models go: "cuda" or "cpu"."""
    events: StepEvents
    """The markers adloader's step timer reads (CUDA's own source on a GPU)."""

    def compute(self, seconds: float) -> None:
        """Queue about ``seconds`` of device work and return at once."""

    def record(self) -> StepEvent:
        """A marker on the device's timeline, recorded now."""

    def synchronize(self) -> None:
        """Block until the device has done everything queued."""


class EmulatedEvent:
    """A marker of :class:`EmulatedDevice`: the wall clock when its thread reaches it."""

    def __init__(self) -> None:
        self._reached = threading.Event()
        self.at = 0.0

    def reach(self, at: float) -> None:
        self.at = at
        self._reached.set()

    def query(self) -> bool:
        return self._reached.is_set()

    def synchronize(self) -> None:
        self._reached.wait()

    def elapsed_time(self, end: "EmulatedEvent") -> float:
        return (end.at - self.at) * 1000.0


class EmulatedDevice:
    """An asynchronous device emulated by a thread that sleeps through its queue (``--dry-run``).

    ``clock`` stamps the markers; injectable for tests."""

    name = "emulated (a thread sleeping through queued work; the CPU clock stands in for the GPU's timeline)"
    emulated = True
    torch_device = "cpu"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="emulated-gpu", daemon=True)
        self._thread.start()
        self.events = _EmulatedEvents(self)

    def compute(self, seconds: float) -> None:
        self._queue.put(("work", seconds))

    def record(self) -> EmulatedEvent:
        event = EmulatedEvent()
        self._queue.put(("mark", event))
        return event

    def synchronize(self) -> None:
        self.record().synchronize()

    def close(self) -> None:
        self._queue.put(("stop", None))
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            kind, item = self._queue.get()
            if kind == "stop":
                return
            if kind == "work":
                time.sleep(item)
            else:
                item.reach(self._clock())


@dataclass
class _EmulatedEvents:
    """The emulated device's markers as adloader's step timer takes them: always in use."""

    device: EmulatedDevice

    def in_use(self) -> bool:
        return True

    def record(self) -> StepEvent:
        return self.device.record()


class CudaDevice:
    """The process's current CUDA device. ``compute`` queues square fp32 matmuls, as many as
    the calibration says make ``seconds``: the big asynchronous kernels of a training step."""

    emulated = False
    torch_device = "cuda"
    MATMUL_N = 4096

    def __init__(self) -> None:
        torch.cuda.init()
        self.name = torch.cuda.get_device_name()
        self.events = CudaEvents()
        self._a = torch.randn(self.MATMUL_N, self.MATMUL_N, device="cuda")
        self._out = torch.empty_like(self._a)
        self.matmul_s = self._calibrate()

    def _calibrate(self, repeats: int = 20) -> float:
        for _ in range(3):
            torch.mm(self._a, self._a, out=self._out)
        start = self.record()
        for _ in range(repeats):
            torch.mm(self._a, self._a, out=self._out)
        end = self.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / repeats

    def compute(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.matmul_s))):
            torch.mm(self._a, self._a, out=self._out)

    def record(self) -> StepEvent:
        return self.events.record()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def open_device(dry_run: bool) -> CheckDevice:
    """The emulated device for a dry run, else the CUDA GPU (``GpuCheckError`` if there is none)."""
    if dry_run:
        return EmulatedDevice()
    if not torch.cuda.is_available():
        raise GpuCheckError("no CUDA device is visible to torch here; run with --dry-run to check the code on CPU")
    return CudaDevice()


def training_step(device: CheckDevice, emulated_ms: float = 10.0) -> Callable[[torch.Tensor], None]:
    """One training step on a batch of images: on a GPU the zoo's small ResNet trained on it
    (bench/gpu_step.py); on the emulated device ``emulated_ms`` of queued work (a sleeping step)."""
    if device.emulated:
        return lambda images: device.compute(emulated_ms / 1000.0)
    from bench.gpu_step import DEFAULT_MODEL, ModelStep

    return ModelStep(DEFAULT_MODEL, device.torch_device)
