"""What one control step measured of one job, computed once and read by the policy's view,
the status snapshot, the state file and the job history alike.

Reports carry cumulative counters (samples, data-wait and compute seconds, loader CPU
seconds, bytes read). Rates are differences between the oldest and newest report of
each rank inside the window, summed over ranks:

- achieved T = d(samples)/dt, the job's samples/s;
- data-wait ratio = d(data_wait_s) / (d(data_wait_s) + d(compute_s));
- loader CPU seconds per sample p = d(worker_cpu_s)/d(samples);
- bytes read per sample b = d(read_bytes)/d(samples);
- loads in flight = d(worker_load_s)/dt, the batches the loader workers were loading at
  once on average (Little's law: batches/s x seconds each takes to load).

The max throughput M is measured over each rank's whole run instead
(:func:`run_max_throughput`): a window of a few seconds holds only a few steps of a
starved job, and its partial step at each end swings M by half. Pure functions of the
reports and the times they arrived; no I/O, no clock of their own.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Mapping

from adloader.protocol import Report

MIN_BATCHES_FOR_M = 8
"""M counts once a rank has run this many steps (until then the prediction, if any):
the first steps are warm-up."""

RankWindow = deque[tuple[float, Report]]
"""One rank's reports inside the window: (monotonic time received, report), oldest first."""


@dataclass(frozen=True)
class Rates:
    """What the reports of one job say over the window (None: not enough data yet)."""

    achieved: float | None = None
    data_wait_ratio: float | None = None
    max_throughput: float | None = None
    """d(samples)/d(compute_s) over the window (the job's M is :func:`run_max_throughput`)."""
    cpu_s_per_sample: float | None = None
    bytes_per_sample: float | None = None
    loader_cores: float | None = None
    """Cores the loader workers used: d(worker_cpu_s)/dt."""
    loads_in_flight: float | None = None
    """Batches being loaded at once, on average: d(worker_load_s)/dt (None: no loader timed it)."""
    batches: float | None = None
    """Batches the ranks delivered over the window: the rates are counted in them."""


@dataclass(frozen=True)
class Measurement:
    """One job at one control step."""

    rates: Rates = Rates()
    max_throughput: float | None = None
    """Measured M (:func:`run_max_throughput`): the one M the policy, status and history use."""
    cores_used: float | None = None
    """Cores the job used over the window: its whole group's CPU time when the backend
    accounts for it (what a quota limits), else its loader workers'."""
    cpu_seconds: float = 0.0
    """CPU seconds of the job's whole group (one cpu.stat / cpuacct read per step)."""
    ranks_reporting: int = 0
    """Ranks that reported inside the window."""
    ranks: int = 1
    """Ranks the job has: the largest of world size and ranks reporting, at least one."""
    latest: tuple[Report, ...] = ()
    """Each rank's newest report."""
    steady_workers: int | None = None
    """Workers per rank every report of every rank in the window ran (:func:`steady_workers`)."""


def window_rates(ranks: Mapping[int, RankWindow], now: float, window_s: float) -> Rates:
    """Windowed rates summed over the ranks that reported at least twice in the window."""
    samples = wait = compute = cpu = read = achieved = max_tp = loader_cores = batches = loading = 0.0
    have_tp = have_any = False
    for window in ranks.values():
        points = [(t, r) for t, r in window if t >= now - window_s]
        if len(points) < 2:
            continue
        (t0, first), (t1, last) = points[0], points[-1]
        if t1 <= t0:
            continue
        d_samples = last.samples - first.samples
        d_compute = last.compute_s - first.compute_s
        samples += d_samples
        batches += last.batches - first.batches
        wait += last.data_wait_s - first.data_wait_s
        compute += d_compute
        cpu += last.worker_cpu_s - first.worker_cpu_s
        read += last.read_bytes - first.read_bytes
        achieved += d_samples / (t1 - t0)
        loader_cores += (last.worker_cpu_s - first.worker_cpu_s) / (t1 - t0)
        loading += (last.worker_load_s - first.worker_load_s) / (t1 - t0)
        if d_compute > 0:
            max_tp += d_samples / d_compute
            have_tp = True
        have_any = True
    if not have_any:
        return Rates()
    step = wait + compute
    return Rates(
        achieved=achieved,
        data_wait_ratio=wait / step if step > 0 else None,
        max_throughput=max_tp if have_tp and samples > 0 else None,
        cpu_s_per_sample=cpu / samples if samples > 0 else None,
        bytes_per_sample=read / samples if samples > 0 else None,
        loader_cores=loader_cores if loader_cores > 0 else None,
        loads_in_flight=loading if loading > 0 else None,
        batches=batches,
    )


def run_max_throughput(ranks: Mapping[int, RankWindow]) -> float | None:
    """M over each rank's whole run (its cumulative counters: samples / compute seconds),
    summed over the ranks with MIN_BATCHES_FOR_M steps."""
    total = 0.0
    for window in ranks.values():
        last = window[-1][1] if window else None
        if last is not None and last.batches >= MIN_BATCHES_FOR_M and last.compute_s > 0:
            total += last.samples / last.compute_s
    return total or None


def ranks_reporting(ranks: Mapping[int, RankWindow], now: float, window_s: float) -> int:
    return sum(1 for window in ranks.values() if window and window[-1][0] >= now - window_s)


def steady_workers(ranks: Mapping[int, RankWindow], now: float, window_s: float) -> int | None:
    """The loader workers per rank that every report of every rank inside the window says it
    ran, so that the window's rates were measured at that count; None when the count changed
    inside the window (its rates mix two counts), or no rank reported twice in it."""
    counts = {r.num_workers for window in ranks.values() for t, r in window if t >= now - window_s}
    reported = any(sum(1 for t, _ in window if t >= now - window_s) >= 2 for window in ranks.values())
    if not reported or len(counts) != 1:
        return None
    count = counts.pop()
    return count if count > 0 else None


def group_cores(samples: deque[tuple[float, float]], now: float, cpu_seconds: float, window_s: float) -> float | None:
    """Add (now, the group's CPU seconds) to ``samples`` and age out the old ones; the cores
    the group used over what is left (None until two samples span some time and CPU)."""
    samples.append((now, cpu_seconds))
    while len(samples) > 2 and samples[0][0] < now - window_s:
        samples.popleft()
    (t0, first), (t1, last) = samples[0], samples[-1]
    return (last - first) / (t1 - t0) if t1 > t0 and last > first else None


def measure(
    ranks: Mapping[int, RankWindow], now: float, window_s: float,
    cpu_seconds: float | None, cpu_samples: deque[tuple[float, float]],
) -> Measurement:
    """The job's measurement at ``now``. ``cpu_seconds``: its group's CPU time, None when the
    backend does not account for it (the loader workers' CPU counts instead)."""
    rates = window_rates(ranks, now, window_s)
    latest = tuple(window[-1][1] for window in ranks.values() if window)
    reporting = ranks_reporting(ranks, now, window_s)
    cores = rates.loader_cores
    if cpu_seconds is not None:
        cores = group_cores(cpu_samples, now, cpu_seconds, window_s)
    return Measurement(
        rates=rates, max_throughput=run_max_throughput(ranks), cores_used=cores,
        cpu_seconds=cpu_seconds or 0.0, ranks_reporting=reporting,
        ranks=max([1, reporting, *(r.world_size for r in latest)]), latest=latest,
        steady_workers=steady_workers(ranks, now, window_s),
    )
