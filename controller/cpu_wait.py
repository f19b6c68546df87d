"""How long the controller itself waited for a CPU, from the kernel's scheduler statistics.

Why: a control step needs a few milliseconds of CPU, but on a node its jobs saturate the
controller gets them only as fast as its cgroup's weight lets it, and every plan comes that much
late. In the node benchmark, left in the root cgroup beside a jobs' group weighted 64 times
above it (as cgroup v1 Kubernetes weights kubepods, 1024 shares a core, beside a service's 1024
on a 64-core node), the controller of a six-job mix on two cores waited up to 7.4 s on the run
queue in a step that used 15 ms of CPU, and a newcomer's first plan came 7-10 s after its first
report instead of about 3. Nothing inside the controller can make up for that; the operator can,
by weighting it (docs/fleet.md, "The controller's own CPU"). So the wait is counted (a Prometheus
counter) and, when the time between two steps lost more than a whole control period to it, said
at WARNING with what to do, at most every ``WARN_EVERY_S``.

The wait is the second field of ``/proc/<tid>/schedstat`` (a thread's id names it in /proc as a
process's does): nanoseconds the thread was runnable but not running. Every root (/proc, the
thread id, the clock) is injectable.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

WARN_EVERY_S = 600.0
"""At most one warning this often: a starved controller is starved for as long as the node is
busy, and one line every ten minutes says so without flooding the log."""


def waited_s(schedstat: Path) -> float | None:
    """Seconds the thread whose ``schedstat`` file this is has waited on a run queue so far;
    None when the kernel keeps no such statistics (built without CONFIG_SCHED_INFO) or the file
    cannot be read."""
    try:
        fields = schedstat.read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class CpuWait:
    """The control loop's thread's run-queue wait, read once a step."""

    def __init__(
        self,
        proc: Path = Path("/proc"),
        thread_id: Callable[[], int] = threading.get_native_id,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``thread_id``: the id of the thread that runs the control steps (the caller of
        :meth:`observe`), read at each call."""
        self._proc = proc
        self._thread_id = thread_id
        self._clock = clock
        self._last_wait: float | None = None
        self._last_at: float | None = None
        self._warned_at: float | None = None

    def observe(self, period_s: float) -> float:
        """Seconds the loop's thread waited for a CPU since the previous call (0.0 at the first
        call, or where the kernel says nothing); logs a warning when that exceeds ``period_s``,
        the control period it was meant to take at most."""
        now = self._clock()
        wait = waited_s(self._proc / str(self._thread_id()) / "schedstat")
        previous, since = self._last_wait, (now - self._last_at if self._last_at is not None else 0.0)
        self._last_wait, self._last_at = wait, now
        if wait is None or previous is None or wait < previous:
            return 0.0
        waited = wait - previous
        if waited > period_s and (self._warned_at is None or now - self._warned_at >= WARN_EVERY_S):
            self._warned_at = now
            log.warning(
                "the controller waited %.1f s for a CPU over the last %.1f s (its steps need milliseconds): the "
                "processes beside it are weighted far above it, so its plans come that late. Give it a CPU weight "
                "like the jobs' (docs/fleet.md, \"The controller's own CPU\"); adloader_controller_cpu_wait_seconds_total "
                "counts it", waited, since,
            )
        return waited
