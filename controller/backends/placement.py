"""Nested placement: where a job's group goes in each hierarchy, and which scheduler made its parent.

Jobs on real nodes already sit in cgroups their scheduler made (Slurm's
``slurm_<node>/uid_N/job_J/step_S``, kubelet's ``kubepods/<qos>/pod<uid>/<container>``
or ``kubepods.slice/...scope``, systemd's services and session scopes). adloader
never takes a job out of them: in each hierarchy it manages, the job's group is
``<the launcher's cgroup>/<group>/<job>``. On a bare node the launcher is in the
root, so that is ``/<group>/<job>`` as before. This module holds the pure parts:
reading /proc/PID/cgroup, naming the scheduler, finding job groups again after a
restart. The backends do the writes.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable

log = logging.getLogger(__name__)

UNIFIED = ""
"""The hierarchy key of the cgroup v2 line ("0::/path") in /proc/PID/cgroup."""

SCHEDULERS = ("slurm", "kubernetes", "systemd", "none")

_SLURM = re.compile(r"(^|/)slurm[^/]*/(uid_\d+/)?job_\d+(/|$)")
_SYSTEMD_UNIT = re.compile(r"\.(slice|service|scope)$")


def cgroups_of(pid: int, proc: Path = Path("/proc")) -> dict[str, str]:
    """``pid``'s cgroup path in every hierarchy, keyed by controller ("cpu", "cpuacct",
    "name=systemd", ...; ``UNIFIED`` for the v2 line). Empty if the process is gone."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return {}
    paths: dict[str, str] = {}
    for line in text.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths[UNIFIED] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def launcher_cgroups(pid: int, proc: Path, mount_of: Callable[[str], Path], own_pid: int | None = None) -> dict[str, str]:
    """cgroups_of(pid), each path made a path in its hierarchy's mount (see in_mount)."""
    own_pid = os.getpid() if own_pid is None else own_pid
    shown = cgroups_of(pid, proc)
    own = cgroups_of(own_pid, proc) if any(p.startswith("/..") for p in shown.values()) else {}
    return {h: in_mount(path, mount_of(h), own.get(h, "/"), own_pid) for h, path in shown.items()}


def in_mount(shown: str, mount: Path, own_shown: str, own_pid: int) -> str:
    """``shown`` (a path from another process's /proc/PID/cgroup) as a path in ``mount``.

    A controller in a container with a private cgroup namespace (containerd's default
    on cgroup v2, so a Kubernetes DaemonSet pod) sees other containers' cgroups as
    ``/../../kubepods.slice/...``: relative to its own namespace's root. That root is
    where its own process really is (found in ``mount``, the host's tree, by its pid),
    less its own path as it sees it (``own_shown``). Paths without ``..`` are returned
    as they are."""
    if not shown.startswith("/.."):
        return shown
    own_real = _find_pid(mount, own_pid)
    if own_real is None:
        return shown
    depth = len([p for p in own_shown.split("/") if p])
    root = own_real.parts[: len(own_real.parts) - depth] if depth else own_real.parts
    resolved = os.path.normpath("/" + "/".join(root) + "/" + shown.lstrip("/"))
    return resolved if not resolved.startswith("/..") else shown


def _find_pid(mount: Path, pid: int) -> Path | None:
    """The cgroup (relative to ``mount``) whose cgroup.procs lists ``pid``; None if none does."""
    for directory, _, files in os.walk(mount):
        if "cgroup.procs" in files:
            try:
                pids = (Path(directory) / "cgroup.procs").read_text().split()
            except OSError:
                continue
            if str(pid) in pids:
                return Path(directory).relative_to(mount)
    return None


def detect_scheduler(paths: Iterable[str]) -> str:
    """Which scheduler made these cgroups: "slurm", "kubernetes", "systemd" or "none".

    Slurm is tried first (its jobs also sit in systemd's slurmd.service on a systemd
    host), then kubelet (whose systemd driver also names slices), then systemd."""
    paths = [p for p in paths if p.strip("/")]
    if any(_SLURM.search(p) or "/slurmstepd.scope/job_" in p for p in paths):
        return "slurm"
    if any(part.startswith("kubepods") for p in paths for part in p.split("/")):
        return "kubernetes"
    if any(_SYSTEMD_UNIT.search(part) for p in paths for part in p.split("/")):
        return "systemd"
    return "none"


def parent_below(path: str, group: str) -> str:
    """The cgroup to nest a new job group under, for a process now at ``path``.

    A process already inside one of our job groups (``.../<group>/<job>``, e.g. a job
    re-registering after a controller restart) is placed beside it, not inside it; so is a
    process in the leaf ``.../<group>.leaf`` where cgroup v2 placement moved the processes
    of the cgroup it nests in (a second launcher started from the same shell or container):
    on a real cgroup v2 node each such launcher's job went one leaf deeper than the last,
    under another parent, so no CPU weight could act between them."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[-2] == group:
        parts = parts[:-2]
    while parts and parts[-1] == f"{group}.leaf":
        parts.pop()
    return "/" + "/".join(parts)


def find_job_groups(mount: Path, group: str) -> dict[str, Path]:
    """Every job group ``<anything>/<group>/<job>`` under ``mount``, by job id.

    Walks the hierarchy once (a node's tree is a few hundred directories) without
    descending into job groups. A job id found twice keeps the first and is logged."""
    found: dict[str, Path] = {}
    for directory, subdirs, _ in os.walk(mount):
        if Path(directory).name == group and Path(directory) != mount:
            for job in subdirs:
                job_dir = Path(directory) / job
                if job in found and found[job] != job_dir:
                    log.warning("job group %s found twice (%s and %s): managing the first", job, found[job], job_dir)
                    continue
                found[job] = job_dir
            subdirs.clear()
    return found


def relative(path: Path, mount: Path) -> str:
    """``path`` as /proc/PID/cgroup would show it: relative to the hierarchy's mount, with a leading /."""
    rel = Path(path).relative_to(mount)
    return "/" if rel == Path(".") else f"/{rel}"
