"""The controller's own run-queue wait (controller/cpu_wait.py): read from a fixture /proc tree,
and from the real one while a busy process shares the only CPU the test thread may use."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controller.cpu_wait import WARN_EVERY_S, CpuWait, waited_s

TID = 4242


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _schedstat(proc: Path, waited_ns: int) -> None:
    directory = proc / str(TID)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "schedstat").write_text(f"123456 {waited_ns} 7\n")


def test_waits_are_the_differences_between_steps(tmp_path: Path) -> None:
    clock = FakeClock()
    wait = CpuWait(proc=tmp_path, thread_id=lambda: TID, clock=clock)
    _schedstat(tmp_path, 2_000_000_000)
    assert wait.observe(1.0) == 0.0  # the first read is the baseline
    _schedstat(tmp_path, 2_250_000_000)
    clock.now += 1.0
    assert wait.observe(1.0) == pytest.approx(0.25)
    _schedstat(tmp_path, 2_750_000_000)
    clock.now += 1.0
    assert wait.observe(1.0) == pytest.approx(0.5)


def test_a_step_that_lost_more_than_a_period_warns_at_most_every_ten_minutes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    wait = CpuWait(proc=tmp_path, thread_id=lambda: TID, clock=clock)
    _schedstat(tmp_path, 0)
    wait.observe(1.0)
    waited_ns = 0
    warnings = []
    for _ in range(3):
        waited_ns += 3_000_000_000
        _schedstat(tmp_path, waited_ns)
        clock.now += 4.0
        with caplog.at_level(logging.WARNING, logger="controller.cpu_wait"):
            caplog.clear()
            assert wait.observe(1.0) == pytest.approx(3.0)
            warnings.append([r.getMessage() for r in caplog.records])
    assert len(warnings[0]) == 1 and warnings[1:] == [[], []]
    assert "waited 3.0 s for a CPU over the last 4.0 s" in warnings[0][0]
    assert "docs/fleet.md" in warnings[0][0]
    clock.now += WARN_EVERY_S
    _schedstat(tmp_path, waited_ns + 2_000_000_000)
    with caplog.at_level(logging.WARNING, logger="controller.cpu_wait"):
        caplog.clear()
        wait.observe(1.0)
    assert len(caplog.records) == 1


def test_a_wait_within_the_period_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    wait = CpuWait(proc=tmp_path, thread_id=lambda: TID, clock=clock)
    _schedstat(tmp_path, 0)
    wait.observe(0.5)
    _schedstat(tmp_path, 400_000_000)
    clock.now += 1.0
    with caplog.at_level(logging.WARNING, logger="controller.cpu_wait"):
        assert wait.observe(0.5) == pytest.approx(0.4)
    assert caplog.records == []


def test_a_kernel_without_schedstat_counts_nothing(tmp_path: Path) -> None:
    wait = CpuWait(proc=tmp_path, thread_id=lambda: TID, clock=FakeClock())
    assert waited_s(tmp_path / str(TID) / "schedstat") is None
    assert wait.observe(1.0) == 0.0 and wait.observe(1.0) == 0.0
    (tmp_path / str(TID)).mkdir()
    (tmp_path / str(TID) / "schedstat").write_text("garbage\n")
    assert wait.observe(1.0) == 0.0


@pytest.mark.skipif(not Path(f"/proc/{threading.get_native_id()}/schedstat").exists(),
                    reason="this kernel keeps no scheduler statistics (/proc/<tid>/schedstat)")
def test_a_thread_sharing_its_cpu_with_a_busy_process_is_seen_waiting() -> None:
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only: the busy process and it now share one CPU
        wait = CpuWait()
        wait.observe(60.0)
        deadline = time.thread_time() + 0.3
        while time.thread_time() < deadline:  # 0.3 s of CPU, with the busy process runnable beside it
            pass
        waited = wait.observe(60.0)
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()
    assert waited > 0.0
