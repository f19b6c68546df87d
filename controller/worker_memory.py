"""How many DataLoader workers fit in a job's memory.

A worker costs memory: its own pages (USS: what it alone maps; the dataset copy, decode
buffers) and its share of the prefetched batches, which live in shared memory (torch
hands batches from workers to the main process through it): the job's processes'
proportional shares of shared memory (``Pss_Shmem``) over its workers. A policy that adds workers with no regard for that gets the job
OOM-killed by its memory cgroup, so before each control step the loop asks this module
how many workers each job can hold and the policies never give more
(``JobView.max_workers``).

The room a job has is the tightest of:
- every memory limit on the path from its memory cgroup up to the root: its own
  (``memory.limit_in_bytes`` on cgroup v1, ``memory.max`` on v2) and its scheduler's
  (Slurm's job, a kubelet pod), each less that group's working set (usage less the
  inactive page cache, which the kernel reclaims before it kills);
- the node's available memory (``MemAvailable``) less the reserve the operator keeps
  (``adloader controller --memory-reserve``).
Workers that fit = the workers it runs + (room − margin) / (USS + prefetch share per
worker), split over its ranks; a worker is costed at the most one was seen to cost, and
none is added while the measured cost still grows (a worker just started has not filled
its buffers) or before the job's workers have loaded: a worker that has not yet touched its
dataset holds little, and a cost read then would let a policy add workers that fill up later.
Until a job runs a worker there is nothing to measure: it gets no more workers than it asked
for. Every root (/proc, the cgroup mounts) is injectable.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from controller.backends.placement import UNIFIED, cgroups_of
from controller.policies.base import JobView

log = logging.getLogger(__name__)

DEFAULT_RESERVE_FRACTION = 0.05
DEFAULT_RESERVE_MIN = 1 << 30
UNLIMITED = 1 << 60
"""cgroup v1 writes 'no limit' as a number near 2^63."""
MARGIN_FRACTION = 0.1
"""Of the room, kept free: a worker's memory varies with its batches."""
MARGIN_MIN = 32 << 20
GROWTH = 1.1
"""A worker cost more than this factor above the last measurement is still growing."""
UNLOADED_HOLD_S = 30.0
"""How long a job's first worker cost is held unsettled without evidence that each worker has
loaded (a steady window in which the job delivered a batch per worker): a job slower than that
is settled on the cost then. On a loaded 2-core CI machine two readings 2 s apart both found a
just-forked worker that had not yet allocated its dataset (about 0.25 MiB of its 200 MiB): the
cap said 1195 workers would fit."""
ROOMY = 2.0
"""A job whose room holds this many times the workers no policy gives it anyway
(``ceiling_per_rank`` per rank), each costed at a cheap upper bound (the largest worker's
whole resident set plus an even share of the job's shared memory, from /proc/PID/status),
cannot be capped by its memory: its cap is judged from that bound, and its workers' exact cost
(smaps_rollup) is read only for reports (ROOMY_REPORT_S). On a 16-job node reading it at every
measurement took 5 of the controller's 13 seconds of step time (profiled)."""
ROOMY_REPORT_S = (60.0, 600.0)
"""A roomy job's exact worker cost, which only reports show (``adloader status``, the metrics, the
benchmark), is read 60 s after its workers are first seen (their buffers filled by then), then at
intervals that double up to 600 s; until the first read, reports show the upper bound. A read is
8-11 ms a process here (35 ms for a job of two workers): read 30 s in, the 16-job benchmark's
55 s run, where every job has room to spare, cost the controller 2.7-2.8% of a core against
1.8-2.3% without; read 60 s in, 1.9-2.0% against 1.9% (interleaved, 2026-11-26). In a job's
first hour this reads it 9 times (60, 120, 240, 480, 960 s, then every 600 s)."""
COST_REFRESH_S = 30.0
"""How often a settled worker cost is measured again while the job's processes stay the same
(a resize or a new process measures it at once). Reading smaps_rollup walks a process's page
tables: 2-3 ms per torch process here, 26 ms for a job with four workers; measured every 2 s
that was 1.3% of a core per job (the controller's CPU on a five-job mix went from 0.5% to
4.7%). The room (limits, usage, MemAvailable) is cheap and still read every ``refresh_s``."""


def default_reserve(proc: Path = Path("/proc")) -> int:
    """The node memory reserve when the operator sets none: 5% of MemTotal, at least 1 GiB."""
    total = read_meminfo(proc).get("MemTotal", 0)
    return max(DEFAULT_RESERVE_MIN, int(DEFAULT_RESERVE_FRACTION * total))


def read_meminfo(proc: Path = Path("/proc")) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    result = {}
    for line in (proc / "meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            result[key] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    return result


@dataclass(frozen=True)
class WorkerCost:
    """What one job's workers cost, measured."""

    workers: int
    uss_bytes: float
    """Mean USS of its workers (``upper_bound``: the largest worker's whole resident set)."""
    prefetch_bytes: float
    """Its shared-memory pages (prefetched batches) per worker."""
    upper_bound: bool = False
    """Read cheaply from /proc/PID/status (VmRSS, RssShmem) instead of smaps_rollup: never less
    than the exact cost."""

    @property
    def per_worker(self) -> float:
        return self.uss_bytes + self.prefetch_bytes


@dataclass(frozen=True)
class Room:
    """How much more memory the job may use, and which limit says so."""

    bytes: float
    limited_by: str


@dataclass(frozen=True)
class _Measured:
    """A job's last exact measurement: the most a worker was seen to cost, when, over which
    processes, and whether the cost was still growing."""

    peak: WorkerCost
    at: float
    pids: frozenset[int]
    growing: bool
    first_at: float = 0.0
    """When the job's workers were first measured."""
    loaded: bool = False
    """Whether ``peak`` was read once the job's workers had loaded (or UNLOADED_HOLD_S after
    ``first_at``): until then the cost is held growing."""
    report_interval_s: float = ROOMY_REPORT_S[0]
    """For a roomy job: how long until its exact cost is read again for reports."""


def _at_peak(cost: WorkerCost, last: _Measured | None) -> WorkerCost:
    """``cost``, or the most a worker of the job was seen to cost (``last``) where that is more:
    a worker just started has not filled its buffers yet."""
    if last is not None and last.peak.per_worker > cost.per_worker:
        return dataclasses.replace(cost, uss_bytes=last.peak.uss_bytes, prefetch_bytes=last.peak.prefetch_bytes)
    return cost


def _each_worker_loaded(view: JobView, workers: int) -> bool:
    """Whether the job delivered at least a batch per worker over its last window, its worker
    count steady throughout: each worker has then loaded a batch (indices go to them in turn)."""
    return view.steady_workers is not None and view.window_batches is not None and view.window_batches >= workers


@dataclass(frozen=True)
class _Process:
    """What a process's cost never changes with, read once (again every COST_REFRESH_S)."""

    read_at: float
    parent: int | None
    cmdline: bytes
    memory_group: Path | None


@dataclass
class _PassReads:
    """Kernel values one annotate pass reads once for all its jobs: on a bare node every job
    sits under the same memory groups and reads the same MemAvailable."""

    meminfo: dict[str, int] | None = None
    groups: dict[Path, tuple[float | None, float]] = dataclasses.field(default_factory=dict)
    """Each group's limit (None: none) and working set (0 when it has no limit)."""


@dataclass(frozen=True)
class MemoryVerdict:
    cost: WorkerCost
    room: Room
    max_workers_per_rank: int
    max_workers_total: int
    growing: bool = False
    """Its workers' cost still grows: held at the workers it runs until it holds still."""
    measured: WorkerCost | None = None
    """The exact cost where ``cost`` is the cheap upper bound (a roomy job), read now and then for
    reports; the cap never uses it."""

    @property
    def shown(self) -> WorkerCost:
        """What reports show a worker to cost: the exact reading where there is one."""
        return self.cost if self.measured is None else self.measured


@dataclass(frozen=True)
class _Measurement:
    """One pass over the jobs due a measurement: when it read the kernel, and each job's view
    with its verdict (None: no worker to measure yet)."""

    at: float
    verdicts: tuple[tuple[JobView, MemoryVerdict | None], ...]


class WorkerMemory:
    """Measures each job's worker memory and room, and caps its workers in the policy's views."""

    def __init__(
        self,
        reserve_bytes: int | None = None,
        proc: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        refresh_s: float = 2.0,
        roomy_refresh_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        ceiling_per_rank: int = 32,
        executor: Executor | None = None,
    ) -> None:
        """``refresh_s``: how often a job is measured (reading each worker's smaps costs CPU);
        ``roomy_refresh_s``: how often instead while its room holds ROOMY times the workers
        no policy gives it anyway: its cap decides nothing until the node's memory is half
        gone, and on a 16-job node the status reads of 8 jobs a second were a fifth of the
        controller's CPU (profiled);
        ``ceiling_per_rank``: the most workers per rank a policy gives anyway (the node's
        ``max_workers_per_job``): a memory cap at or above it decides nothing and is logged at
        DEBUG only, as is a cap held while the workers' cost still grows. ``executor``: where
        the kernel is read (None: in :meth:`annotate` itself). The daemon gives it a thread
        of its own: reading a process's smaps_rollup or cmdline waits for the process's
        memory map, which a job forking its workers holds, and a job starved of CPU holds it
        for seconds (the control step stalled 2.4 s at a time on seeded random mix 11)."""
        self.proc = proc
        self.cgroup_root = cgroup_root
        self.reserve_bytes = default_reserve(proc) if reserve_bytes is None else reserve_bytes
        self.refresh_s = refresh_s
        self.roomy_refresh_s = roomy_refresh_s
        self._clock = clock
        self.ceiling_per_rank = ceiling_per_rank
        self._executor = executor
        self._pending: Future[_Measurement] | None = None
        self._verdicts: dict[str, tuple[float, MemoryVerdict]] = {}
        self._logged: dict[str, int] = {}
        # read and written only by _measure (the executor's thread when there is one)
        self._measured: dict[str, _Measured] = {}
        self._roomy_since: dict[str, float] = {}
        self._processes: dict[int, _Process] = {}

    def annotate(self, views: Sequence[JobView], pids: Mapping[str, Iterable[int]]) -> list[JobView]:
        """``views`` with ``max_workers`` set where a job's workers were measured. With an
        executor, the jobs due a measurement are measured there and their verdicts count
        from the first step after it finishes; until a job has one it gets no more workers
        than it asked for."""
        now = self._clock()
        live = {view.job_id for view in views}
        for per_job in (self._verdicts, self._logged):
            for job_id in set(per_job) - live:
                del per_job[job_id]
        if self._pending is not None and self._pending.done():
            finished, self._pending = self._pending.result(), None
            self._take(finished, live)
        due = [view for view in views
               if (cached := self._verdicts.get(view.job_id)) is None or now - cached[0] >= self._refresh(cached[1])]
        job_pids = {job_id: frozenset(job) for job_id, job in pids.items()}
        if self._executor is None:
            self._take(self._measure(due, job_pids, now), live)
        elif self._pending is None and due:
            self._pending = self._executor.submit(self._measure, due, job_pids, now)
        return [
            dataclasses.replace(view, max_workers=cached[1].max_workers_per_rank)
            if (cached := self._verdicts.get(view.job_id)) is not None
            else dataclasses.replace(view, max_workers=view.requested_workers or 1)  # nothing measured yet
            for view in views
        ]

    def _refresh(self, verdict: MemoryVerdict) -> float:
        """How long ``verdict`` holds: a roomy job's (costed at the cheap bound only) longer."""
        return self.roomy_refresh_s if verdict.cost.upper_bound else self.refresh_s

    def _measure(self, views: Sequence[JobView], pids: Mapping[str, frozenset[int]], now: float) -> _Measurement:
        """The verdict of each of ``views`` (None: no worker to measure yet), at ``now``."""
        alive = {pid for job_pids in pids.values() for pid in job_pids}
        self._processes = {pid: known for pid, known in self._processes.items()
                           if pid in alive and now - known.read_at < COST_REFRESH_S}
        self._measured = {job_id: known for job_id, known in self._measured.items() if job_id in pids}
        self._roomy_since = {job_id: since for job_id, since in self._roomy_since.items() if job_id in pids}
        reads = _PassReads()
        return _Measurement(at=now, verdicts=tuple(
            (view, self.verdict(view, set(pids.get(view.job_id, ())), reads)) for view in views))

    def _take(self, measurement: _Measurement, live: set[str]) -> None:
        """Keep and log the verdicts of the jobs still running, dated when they were measured
        (a job without one is asked again)."""
        for view, verdict in measurement.verdicts:
            if view.job_id not in live:
                continue
            self._log_change(view, verdict)
            if verdict is not None:
                self._verdicts[view.job_id] = (measurement.at, verdict)

    def workers_limit(self, job_id: str) -> int | None:
        """Most workers, all ranks, the job's memory holds at its last measurement (None: not measured)."""
        cached = self._verdicts.get(job_id)
        return None if cached is None else cached[1].max_workers_total

    def cost_of(self, job_id: str) -> WorkerCost | None:
        """What a worker of the job cost at its last measurement, read exactly where it was
        (:attr:`MemoryVerdict.shown`; None: not measured)."""
        cached = self._verdicts.get(job_id)
        return None if cached is None else cached[1].shown

    def verdict(self, view: JobView, pids: set[int], reads: _PassReads | None = None) -> MemoryVerdict | None:
        """The job's worker cost, room and the workers per rank that fit; None before it runs a
        worker (or when its processes are gone). A worker is costed at the most one of the
        job's workers was seen to cost: a worker just started has not filled its buffers yet.
        ``reads``: node values already read in this pass."""
        room = self.room(pids, reads)
        margin = max(MARGIN_MIN, MARGIN_FRACTION * max(0.0, room.bytes))
        workers = self._workers(pids)
        bound = self.cost_bound(pids, workers)
        if bound is None:
            return None
        now = self._clock()
        last = self._measured.get(view.job_id)
        if room.bytes - margin >= ROOMY * bound.per_worker * self.ceiling_per_rank * max(1, view.ranks):
            verdict = self._fitting(view, bound, room, margin, growing=False)
            return dataclasses.replace(verdict, measured=self._reported(view.job_id, last, pids, workers, now))
        if last is not None and not last.growing and last.pids == frozenset(pids) and now - last.at < COST_REFRESH_S:
            return self._fitting(view, last.peak, room, margin, growing=False)  # measured lately, settled
        cost = self.worker_cost(pids, workers)
        if cost is None:
            return None
        first_at = now if last is None else last.first_at
        loaded = (last is not None and last.loaded) or _each_worker_loaded(view, len(workers)) \
            or now - first_at >= UNLOADED_HOLD_S
        growing = last is None or cost.per_worker > GROWTH * last.peak.per_worker or not loaded
        cost = _at_peak(cost, last)
        self._measured[view.job_id] = _Measured(peak=cost, at=now, pids=frozenset(pids), growing=growing,
                                                first_at=first_at, loaded=loaded)
        return self._fitting(view, cost, room, margin, growing)

    def _reported(self, job_id: str, last: _Measured | None, pids: set[int], workers: Sequence[int],
                  now: float) -> WorkerCost | None:
        """A roomy job's exact worker cost for reports, read when ROOMY_REPORT_S says (None until then)."""
        known = None if last is None else last.peak
        due = (now - self._roomy_since.setdefault(job_id, now) >= ROOMY_REPORT_S[0] if last is None
               else now - last.at >= last.report_interval_s)
        cost = self.worker_cost(pids, workers) if due else None
        if cost is None:
            return known
        interval = ROOMY_REPORT_S[0] if last is None else min(ROOMY_REPORT_S[1], 2 * last.report_interval_s)
        cost = _at_peak(cost, last)
        self._measured[job_id] = _Measured(peak=cost, at=now, pids=frozenset(pids), growing=False,
                                           report_interval_s=interval,
                                           first_at=now if last is None else last.first_at, loaded=True)
        return cost

    @staticmethod
    def _fitting(view: JobView, cost: WorkerCost, room: Room, margin: float, growing: bool) -> MemoryVerdict:
        """The verdict: the workers it runs plus what fits in ``room`` less ``margin``."""
        extra = math.floor((room.bytes - margin) / cost.per_worker) if cost.per_worker > 0 else 0
        if growing:  # its workers are still filling up: none added until their cost holds still
            extra = min(extra, 0)
        total = cost.workers + extra
        return MemoryVerdict(cost=cost, room=room, max_workers_per_rank=max(0, total // max(1, view.ranks)),
                             max_workers_total=max(0, total), growing=growing)

    def cost_bound(self, pids: set[int], workers: Sequence[int] | None = None) -> WorkerCost | None:
        """An upper bound of a worker's cost, cheap to read: the largest worker's resident set
        (VmRSS: its own pages and every page it shares) plus the job's shared memory
        (RssShmem summed over its processes) over its workers (``workers``: found if not
        given). None without a worker."""
        workers = self._workers(pids) if workers is None else workers
        statuses = {pid: status for pid in pids if (status := self._status(pid))}
        rss = [statuses[pid].get("VmRSS", 0) for pid in workers if pid in statuses]
        if not rss:
            return None
        shmem = sum(status.get("RssShmem", 0) for status in statuses.values())
        return WorkerCost(workers=len(rss), uss_bytes=max(rss), prefetch_bytes=shmem / len(rss), upper_bound=True)

    def worker_cost(self, pids: set[int], workers: Sequence[int] | None = None) -> WorkerCost | None:
        """Mean USS of the job's loader workers and their share of its shared memory
        (``workers``: found if not given)."""
        workers = self._workers(pids) if workers is None else workers
        rollups = {pid: rollup for pid in pids if (rollup := self._rollup(pid))}  # each read once: they cost
        uss = [rollups[pid]["Private_Clean"] + rollups[pid]["Private_Dirty"] for pid in workers if pid in rollups]
        if not uss:
            return None
        shmem = sum(rollup.get("Pss_Shmem", 0) for rollup in rollups.values())
        return WorkerCost(workers=len(uss), uss_bytes=sum(uss) / len(uss), prefetch_bytes=shmem / len(uss))

    def room(self, pids: set[int], reads: _PassReads | None = None) -> Room:
        """The tightest room: each memory limit from the job's group up, and the node's reserve
        (``reads``: node values already read in this pass, and where to keep those read now)."""
        reads = _PassReads() if reads is None else reads
        if reads.meminfo is None:
            reads.meminfo = read_meminfo(self.proc)
        best = Room(bytes=reads.meminfo.get("MemAvailable", 0) - self.reserve_bytes,
                    limited_by=f"node (MemAvailable less the {self.reserve_bytes >> 20} MiB reserve)")
        groups = {group for pid in pids if (known := self._process(pid)) and (group := known.memory_group)}
        seen: set[Path] = set()
        for start in sorted(groups):
            group: Path | None = start
            while group is not None and group not in seen:  # the job's groups and their ancestors
                seen.add(group)
                if group not in reads.groups:
                    limit = self._limit(group)
                    reads.groups[group] = (limit, 0.0 if limit is None else self._working_set(group))
                limit, used = reads.groups[group]
                if limit is not None and limit - used < best.bytes:
                    best = Room(bytes=limit - used, limited_by=f"{group} limit {limit / (1 << 20):.0f} MiB")
                group = None if group == self._mount(group) else group.parent
        return best

    # ------------------------------------------------------------------ reading the kernel

    def _process(self, pid: int) -> _Process | None:
        """Its parent, command line and memory group (None if it is gone), read once a
        COST_REFRESH_S: a control step asked for them three times a job."""
        known = self._processes.get(pid)
        if known is None:
            try:
                cmdline = (self.proc / str(pid) / "cmdline").read_bytes()
            except OSError:
                return None
            known = _Process(read_at=self._clock(), parent=self._parent(pid), cmdline=cmdline,
                             memory_group=self._memory_group(pid))
            self._processes[pid] = known
        return known

    def _workers(self, pids: set[int]) -> list[int]:
        """The job's loader workers: leaves of its process tree (see :meth:`_is_worker`)."""
        parents = {pid: known.parent for pid in pids if (known := self._process(pid)) and known.parent is not None}
        has_children = set(parents.values())
        return [pid for pid in sorted(pids) if pid not in has_children and self._is_worker(pid, parents, pids)]

    def _status(self, pid: int) -> dict[str, int] | None:
        """VmRSS and RssShmem of /proc/PID/status in bytes."""
        try:
            text = (self.proc / str(pid) / "status").read_text()
        except OSError:
            return None
        values = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssShmem"):
                fields = rest.split()
                if fields and fields[0].isdigit():
                    values[key] = int(fields[0]) * 1024
        return values

    def _parent(self, pid: int) -> int | None:
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def _is_worker(self, pid: int, parents: Mapping[int, int], job_pids: set[int]) -> bool:
        """A DataLoader worker: a leaf of the job's process tree (the caller checks) whose parent
        is in the job and which is a fork of it (same command line: a rank, or adloader's
        spawner helper) or a multiprocessing spawn/forkserver child."""
        ppid = parents.get(pid)
        if ppid is None or ppid not in job_pids:
            return False
        mine, parent = self._process(pid), self._process(ppid)
        if mine is None or parent is None:
            return False
        return bool(mine.cmdline) and (mine.cmdline == parent.cmdline or b"multiprocessing" in mine.cmdline)

    def _rollup(self, pid: int) -> dict[str, int] | None:
        """The process's /proc/PID/smaps_rollup in bytes (USS = Private_Clean + Private_Dirty;
        Pss_Shmem its proportional share of shared memory)."""
        try:
            text = (self.proc / str(pid) / "smaps_rollup").read_text()
        except OSError:
            return None
        values = {"Private_Clean": 0, "Private_Dirty": 0}
        for line in text.splitlines()[1:]:
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                values[key] = int(fields[0]) * 1024
        return values

    def _memory_group(self, pid: int) -> Path | None:
        """The directory of the memory cgroup ``pid`` is in (v1 memory hierarchy, else v2)."""
        paths = cgroups_of(pid, self.proc)
        if "memory" in paths:
            return self.cgroup_root / "memory" / paths["memory"].lstrip("/")
        v2 = paths.get(UNIFIED)
        if v2 is not None:
            for mount in (self.cgroup_root / "unified", self.cgroup_root):
                if (mount / "cgroup.controllers").exists():
                    candidate = mount / v2.lstrip("/")
                    if (candidate / "memory.current").exists():
                        return candidate
        return None

    def _mount(self, group: Path) -> Path:
        if group.is_relative_to(self.cgroup_root / "memory"):
            return self.cgroup_root / "memory"
        if group.is_relative_to(self.cgroup_root / "unified"):
            return self.cgroup_root / "unified"
        return self.cgroup_root

    def _limit(self, group: Path) -> float | None:
        for name in ("memory.limit_in_bytes", "memory.max"):
            try:
                text = (group / name).read_text().strip()
            except OSError:
                continue
            if text == "max":
                return None
            value = float(text)
            return None if value >= UNLIMITED else value
        return None

    def _working_set(self, group: Path) -> float:
        """Usage less the inactive page cache, as kubelet counts it."""
        usage = 0.0
        for name in ("memory.usage_in_bytes", "memory.current"):
            try:
                usage = float((group / name).read_text())
                break
            except OSError:
                continue
        inactive = self._stat(group, "total_inactive_file") or self._stat(group, "inactive_file") or 0.0
        return max(0.0, usage - inactive)

    def _stat(self, group: Path, key: str) -> float | None:
        try:
            for line in (group / "memory.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return float(value)
        except OSError:
            return None
        return None

    def _log_change(self, view: JobView, verdict: MemoryVerdict | None) -> None:
        """INFO once each time a job's cap starts to decide something or moves while it does
        (below ``ceiling_per_rank``, its workers' cost settled): the reason its workers stop
        there. Caps that bind nothing, and holds while the cost still grows, go to DEBUG: on
        a roomy node they moved at every measurement (622, 620, 615 workers ...)."""
        if verdict is None:
            return
        binding = not verdict.growing and verdict.max_workers_per_rank < self.ceiling_per_rank
        level = logging.INFO if binding and self._logged.get(view.job_id) != verdict.max_workers_per_rank \
            else logging.DEBUG
        if binding:
            self._logged[view.job_id] = verdict.max_workers_per_rank
        else:
            self._logged.pop(view.job_id, None)
        log.log(
            level,
            "job %s (%s): memory fits %d workers per rank%s: %.0f MiB more may be used (%s), a worker costs "
            "%s%.0f MiB (%s %.0f MiB + prefetch %.0f MiB); no policy gives it more",
            view.job_id, view.name, verdict.max_workers_per_rank,
            " for now (its workers' memory still grows)" if verdict.growing else "",
            verdict.room.bytes / (1 << 20), verdict.room.limited_by,
            "at most " if verdict.cost.upper_bound else "", verdict.cost.per_worker / (1 << 20),
            "RSS" if verdict.cost.upper_bound else "USS", verdict.cost.uss_bytes / (1 << 20),
            verdict.cost.prefetch_bytes / (1 << 20),
        )
