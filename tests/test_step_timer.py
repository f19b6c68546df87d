"""The step timer's split of a step into data wait and compute, on a device's timeline.

Under asynchronous CUDA a training loop queues its kernels and calls ``next()`` at once: a
wall-clock timer then calls the whole load a wait although the GPU was computing. The timer
reads the split from device markers instead, lazily, with no synchronisation. Here the device
is a timeline the test drives (the markers' clock-like root), then the emulated device of
``bench.gpu --dry-run`` under a real adloader.DataLoader; the CUDA path itself runs in
``python -m bench.gpu`` and in tests/test_dataloader.py where a GPU is present.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from adloader import DataLoader
from adloader.dataloader.stats import LoaderCounters, StepTimer, make_step_timer
from bench.gpu_check.data_wait import SleepyBatches
from bench.gpu_check.device import EmulatedDevice


@dataclass
class Timeline:
    """A device the test drives: ``now`` is the host's clock, ``busy_until`` when the queued work ends."""

    now: float = 0.0
    busy_until: float = 0.0
    used: bool = True
    recorded: list["Marker"] = field(default_factory=list)

    def in_use(self) -> bool:
        return self.used

    def record(self) -> "Marker":
        marker = Marker(self, max(self.now, self.busy_until))
        self.recorded.append(marker)
        return marker

    def queue(self, seconds: float) -> None:
        self.busy_until = max(self.now, self.busy_until) + seconds


@dataclass
class Marker:
    timeline: Timeline
    at: float

    def query(self) -> bool:
        return self.timeline.now >= self.at

    def synchronize(self) -> None:
        self.timeline.now = max(self.timeline.now, self.at)

    def elapsed_time(self, end: "Marker") -> float:
        return (end.at - self.at) * 1000.0


def _steps(timer: StepTimer, device: Timeline, steps: list[tuple[float, float, float]]) -> None:
    """Each step: wait ``load`` in next(), spend ``python`` queueing, queue ``kernels`` of device work."""
    for load, python, kernels in steps:
        timer.enter()
        device.now += load
        timer.leave(delivered=True)
        device.now += python
        device.queue(kernels)


def test_a_wait_hidden_behind_queued_kernels_is_compute_not_data_wait() -> None:
    device = Timeline()
    counters = LoaderCounters()
    timer = make_step_timer(counters, device)
    _steps(timer, device, [(0.030, 0.001, 0.040)] * 10)  # loads 30 ms, kernels 40 ms: the GPU never waits
    timer.enter()  # the next step starts: the last step's compute ends here
    timer.settle()
    assert timer.on_device
    assert counters.data_wait_s == pytest.approx(0.030)  # only the first step's load, before any kernel
    assert counters.compute_s == pytest.approx(10 * 0.040 - 0.0, rel=0.05)


def test_a_starved_device_waits_for_what_its_kernels_do_not_cover() -> None:
    device = Timeline()
    counters = LoaderCounters()
    timer = make_step_timer(counters, device)
    _steps(timer, device, [(0.060, 0.001, 0.020)] * 10)
    timer.enter()
    timer.settle()
    # after the first step, the device idles through the load less the 20 ms of kernels it still had
    assert counters.data_wait_s == pytest.approx(0.060 + 9 * (0.060 - 0.020), rel=0.02)
    assert counters.compute_s == pytest.approx(10 * 0.021, rel=0.02)


def test_markers_are_read_only_once_the_device_has_reached_them_and_settle_waits() -> None:
    device = Timeline()
    counters = LoaderCounters()
    timer = make_step_timer(counters, device)
    _steps(timer, device, [(0.0, 0.0, 1.0)] * 3)  # three seconds of work queued at once
    timer.enter()
    assert (counters.data_wait_s, counters.compute_s) == (0.0, 0.0), "nothing read before the device got there"
    device.now = 1.5  # the first step's kernels are done: its end marker (the second step's A) is reached
    timer.enter()
    timer.leave(delivered=True)
    assert counters.compute_s == pytest.approx(1.0)
    timer.settle()
    assert counters.compute_s == pytest.approx(3.0)
    assert device.now == pytest.approx(3.0), "settle waited for the device"


def test_the_epoch_gap_is_no_step_on_the_device() -> None:
    device = Timeline()
    counters = LoaderCounters()
    timer = make_step_timer(counters, device)
    _steps(timer, device, [(0.01, 0.0, 0.02)] * 2)
    timer.enter()
    timer.leave(delivered=False)  # the epoch ends
    device.now += 100.0
    _steps(timer, device, [(0.01, 0.0, 0.02)])
    timer.enter()
    timer.settle()
    assert counters.data_wait_s + counters.compute_s < 1.0


def test_the_wall_clock_times_steps_until_the_process_uses_the_device() -> None:
    device = Timeline(used=False)
    counters = LoaderCounters()
    timer = StepTimer(counters, clock=lambda: device.now, events=device)
    _steps(timer, device, [(0.5, 0.0, 0.0)] * 2)
    assert not timer.on_device and not device.recorded, "no marker before the device is in use"
    device.used = True  # the job initialised CUDA (model.cuda()) after its first steps
    _steps(timer, device, [(0.030, 0.001, 0.040)] * 3)
    timer.enter()
    timer.settle()
    assert timer.on_device
    # two wall-timed waits of 0.5 s and their compute; the step in flight at the switch is not counted
    assert counters.data_wait_s == pytest.approx(1.0 + 0.030)
    assert counters.compute_s == pytest.approx(0.0 + 3 * 0.040, rel=0.05)


@pytest.mark.parametrize("load_s, kernels_s", [(0.030, 0.060), (0.060, 0.015)], ids=["kernels-outlast", "starved"])
def test_the_loader_reads_the_split_from_an_asynchronous_device(load_s: float, kernels_s: float) -> None:
    """A real loader (one worker) feeding the emulated asynchronous device: the reporter's wait is
    the device's idle time, where the wall clock counts every load as a wait."""
    device = EmulatedDevice()
    steps = 24
    loader = DataLoader(SleepyBatches(steps, load_s), batch_size=1, num_workers=1)
    loader.step_events = device.events
    wall = LoaderCounters()
    wall_timer = StepTimer(wall)
    try:
        iterator = iter(loader)
        for _ in range(steps):
            wall_timer.enter()
            next(iterator)
            wall_timer.leave(delivered=True)
            device.compute(kernels_s)
        device.synchronize()
        assert next(iterator, None) is None
        loader.settle_step_timing()
    finally:
        loader.close()
        device.close()
    counters = loader.counters
    fraction = counters.data_wait_s / (counters.data_wait_s + counters.compute_s)
    wall_fraction = wall.data_wait_s / (wall.data_wait_s + wall.compute_s)
    idle = max(0.0, load_s - kernels_s) / max(load_s, kernels_s)
    detail = f"timer {fraction:.3f}, wall clock {wall_fraction:.3f}, device idle {idle:.3f}"
    assert abs(fraction - idle) < 0.12, detail
    if idle == 0.0:
        assert wall_fraction > 0.4, f"the wall clock is fooled by queued kernels: {detail}"
