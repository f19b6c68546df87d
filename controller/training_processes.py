"""Training processes apart from the CPU group that shares their job's loading cores.

Why: a job's CPU weight and quota are there to share loading cores between jobs. Set on
a group that also holds the job's training processes, they starve those too: at weight 36
against a neighbour's 1172, a rank that sleeps through a 40 ms GPU step wakes 57 ms late
on average and its steps take 2.4x as long; kept apart as below it wakes 0.1 ms late
(``python -m bench.trainer_stall``). On a real GPU that wait idles the device with a batch
ready, whatever the policy meant to take from the job.

So a rank whose loader runs worker processes is moved out of the job's CPU group, back to
the cgroup its job came from (the scheduler's; the root on a bare node: see
``ResourceBackend.detach``), and the processes its loaders load in, which its reports name
(``Report.loader_pids``: the helpers its loaders fork workers from, and the workers), are
moved back into the job's group at the next control step, those that descend from it (a
report moves nothing of another's). Nothing else it starts is: a framework that starts
another rank as its child (Lightning's DDP launcher starts rank 1 from rank 0) leaves that
rank where its own reports place it, before its first report too, so its training is never
counted as loading and it is not moved back and forth. A rank whose library does not name
them (older) has its children moved instead, from every thread's ``children`` file, all but
the job's known ranks. A rank that loads in its own process (no workers, batches arriving) stays in the
group or returns to it: then its loading is what the group shares. The launcher and
torchrun never report and stay in the group; the job's CPU time (``cpu_seconds``) is then
its loading's alone.

Ranks are known from their reports (the peer's pid, from SO_PEERCRED); a restarted
controller learns them again from their next report. Every root (/proc) is injectable.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from controller.backends.base import BackendError, ResourceBackend
from controller.processes import ancestors, children_of, start_time

log = logging.getLogger(__name__)

MODES = ("apart", "with-loaders")
"""``adloader controller --training-processes``: "apart" (the default) moves ranks with
workers out of their job's CPU group; "with-loaders" leaves every process of the job in it."""


LOADING_ALONE_REPORTS = 2
"""Consecutive reports with batches but no worker after which a rank is taken to load in its
own process. One is not enough: a loader's last batches arrive as its workers stop, at the end
of an epoch and in the report a rank sends as it exits."""


_MOVED_OUT = "moved out of the job's CPU group: its weight and quota act on the job's loaders only"
_MOVED_IN = "moved back into the job's CPU group: it loads in its own process"


@dataclass
class _Rank:
    apart: bool = False
    """Whether it should be out of the job's CPU group (its loader runs workers)."""
    batches: int = 0
    """Batches it had reported at its last report."""
    loading_alone: int = 0
    """Consecutive reports with batches but no worker running."""
    stuck: bool = False
    """The kernel refused to move it: left where it is, and said once."""
    outside: bool = False
    """Out of the job's CPU group at the last step (moved by this controller or, after a
    restart, by the one before)."""
    moved_out: bool = False
    """Out of the job's group once already (moved, or found there after a restart): its
    start-up was in the group until then, and is behind it since."""
    started: int | None = None
    """Its start time (clock ticks after boot, /proc/PID/stat): a pid reused by another process
    after the rank exited has another, and is never moved."""
    loaders: tuple[int, ...] | None = None
    """The processes its loaders load in, as its last report named them; None: its library
    does not name them."""


class TrainingProcesses:
    """Which of a job's processes are its ranks, and keeping them apart from its loaders."""

    def __init__(self, backend: ResourceBackend, proc: Path = Path("/proc"), mode: str = "apart") -> None:
        if mode not in MODES:
            raise ValueError(f"training processes mode {mode!r}: use one of {', '.join(MODES)}")
        self.backend = backend
        self._proc = Path(proc)
        self.enabled = mode == "apart" and "groups" in backend.capabilities
        self._ranks: dict[str, dict[int, _Rank]] = {}
        self._regrouped: set[str] = set()

    def reported(
        self, job_id: str, pid: int, running_workers: int, batches: int, loader_pids: Iterable[int] | None = None,
    ) -> None:
        """Rank ``pid`` of the job reported: workers running -> apart; no worker while its
        batches advance, LOADING_ALONE_REPORTS times running -> it loads itself, so with its
        loaders; otherwise (between epochs, before its first workers) as it was. ``loader_pids``:
        the processes its loaders load in (None: its library does not say)."""
        if not self.enabled or pid <= 0:
            return
        rank = self._ranks.setdefault(job_id, {}).setdefault(
            pid, _Rank(batches=batches, started=start_time(pid, self._proc)))
        rank.loading_alone = rank.loading_alone + 1 if running_workers == 0 and batches > rank.batches else 0
        if running_workers > 0:
            rank.apart = True
        elif rank.loading_alone >= LOADING_ALONE_REPORTS:
            rank.apart = False
        rank.batches = batches
        rank.loaders = None if loader_pids is None else tuple(loader_pids)

    def place(self, job_id: str, group_pids: set[int]) -> set[int]:
        """Move the job's ranks out of (or back into) its group and the processes their loaders
        load in into it, as needed; the job's processes: ``group_pids`` (its group's, read this
        step) and its ranks apart."""
        self._regrouped.discard(job_id)
        ranks = self._ranks.get(job_id)
        if not ranks:
            return group_pids
        processes = set(group_pids)
        for pid, rank in list(ranks.items()):
            if rank.started is None or start_time(pid, self._proc) != rank.started:
                del ranks[pid]  # gone (or its pid taken by another process)
                continue
            processes.add(pid)
            inside = pid in group_pids
            if inside == rank.apart and not rank.stuck:  # on the wrong side of the job's group
                move, outcome = (self.backend.detach, _MOVED_OUT) if rank.apart else (self.backend.attach, _MOVED_IN)
                if self._move(job_id, pid, rank, move, outcome):
                    inside = not inside
                    if not inside and not rank.moved_out:
                        self._regrouped.add(job_id)
            rank.outside = not inside
            rank.moved_out = rank.moved_out or rank.outside  # one found outside (a restart) is past its start-up
            if rank.apart:
                for loader in self._loaders_outside(pid, rank, set(ranks), group_pids):
                    try:
                        self.backend.attach(job_id, loader)
                    except BackendError as exc:
                        log.debug("job %s: loader process %d of rank %d not moved into the job's group: %s",
                                  job_id, loader, pid, exc)
                        continue
                    processes.add(loader)
        return processes

    def _loaders_outside(self, pid: int, rank: _Rank, ranks: set[int], group_pids: set[int]) -> set[int]:
        """The processes rank ``pid``'s loaders load in that are not in the job's group: those
        its reports name that descend from it; where its library names none, its children
        that are not ranks of the job."""
        if rank.loaders is None:
            return children_of(pid, self._proc) - group_pids - ranks
        outside = set(rank.loaders) - group_pids - ranks
        return {loader for loader in outside if pid in ancestors(loader, self._proc)}

    def regrouped(self, job_id: str) -> bool:
        """Whether the last :meth:`place` moved one of the job's ranks out of its group for the
        first time: until then the group's CPU time held that rank's start-up (imports, dataset,
        forking its loader), after it only the job's loading. Later moves (a rank that loads in
        its own process while it evaluates, and back) leave the group's loading in it."""
        return job_id in self._regrouped

    def apart(self, job_id: str) -> int:
        """How many of the job's ranks were out of its CPU group at the last step."""
        return sum(rank.outside for rank in self._ranks.get(job_id, {}).values())

    def forget(self, job_id: str) -> None:
        """The job is gone."""
        self._ranks.pop(job_id, None)
        self._regrouped.discard(job_id)

    def _move(self, job_id: str, pid: int, rank: _Rank, move: Callable[[str, int], None], outcome: str) -> bool:
        """Whether ``move`` moved it; a refusal is said once and never tried again."""
        try:
            move(job_id, pid)
        except BackendError as exc:
            if (self._proc / str(pid)).is_dir():
                rank.stuck = True
                log.warning("job %s: training process %d stays where it is: %s", job_id, pid, exc)
            return False
        log.info("job %s: training process %d %s", job_id, pid, outcome)
        return True
