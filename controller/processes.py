"""The process tree as /proc shows it: parents, children, start times.

Why its own module: the controller's authorization (peer.py: a rank kept apart from its
job's group belongs to the job through its ancestors) and the placement of training
processes (training_processes.py: a rank's children, and a check that a pid still is the
rank it was) read the same files. Every function takes the /proc root, for fixture trees.
"""
from __future__ import annotations

from pathlib import Path

MAX_ANCESTORS = 64


def stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the state first, then the parent
    pid, ...: proc(5)'s fields 3 onwards); None if the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    return stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses


def start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When ``pid`` started (proc(5) field 22, clock ticks after boot); None if it is gone. A
    pid reused by another process has another."""
    fields = stat_fields(pid, proc)
    return int(fields[19]) if fields is not None and len(fields) > 19 and fields[19].isdigit() else None


def ancestors(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """``pid``'s parent, its parent's parent, ... up to (not including) pid 1; at most MAX_ANCESTORS."""
    found: list[int] = []
    while len(found) < MAX_ANCESTORS:
        fields = stat_fields(pid, proc)
        pid = int(fields[1]) if fields is not None and len(fields) > 1 and fields[1].isdigit() else 0
        if pid <= 1:
            break
        found.append(pid)
    return found


def children_of(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The child processes of ``pid``, from every thread's ``task/<tid>/children`` (a child
    is listed under the thread that forked it). Empty if it is gone."""
    children: set[int] = set()
    try:
        threads = list((proc / str(pid) / "task").iterdir())
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return children
    for thread in threads:
        try:
            children.update(int(child) for child in (thread / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return children
