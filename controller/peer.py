"""Who is on the other end of a controller connection, and which job's cgroup holds it.

Authorization never trusts a field of a message: the kernel tells us the peer's
pid/uid/gid (SO_PEERCRED, taken when it connected), and the cgroup tree tells us
which job that pid belongs to. A process may report only for the job whose group
holds it.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from controller.backends.placement import cgroups_of
from controller.processes import ancestors

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The connecting process's credentials, as the kernel recorded them at connect()."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def cgroup_paths(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """The cgroup path of ``pid`` in every hierarchy (the third field of /proc/PID/cgroup);
    empty if the process is gone."""
    return list(dict.fromkeys(cgroups_of(pid, proc).values()))


def in_job_group(pid: int, group: str, job_id: str, proc: Path = Path("/proc")) -> bool:
    """True if some hierarchy places ``pid`` in ``<group>/<job_id>`` or a cgroup nested below it
    (a training framework may create sub-groups inside the job's group)."""
    for path in cgroup_paths(pid, proc):
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts) - 1):
            if parts[i] == group and parts[i + 1] == job_id:
                return True
    return False


def peer_belongs_to_job(
    pid: int, job_id: str, group: str, job_pids: Callable[[str], set[int]], proc: Path = Path("/proc")
) -> bool:
    """True if process ``pid`` is one of the job's processes: placed under the job's group
    in /proc/PID/cgroup (nested cgroups included), listed by the backend (``job_pids``,
    which is also how the affinity fallback knows its process trees), or a descendant of
    one listed (a rank kept apart from the group, training_processes.py)."""
    if pid <= 0:
        return False
    if in_job_group(pid, group, job_id, proc):
        return True
    members = job_pids(job_id)
    return pid in members or any(ancestor in members for ancestor in ancestors(pid, proc))
