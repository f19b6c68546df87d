"""Pick the backend this node can use: cgroup v2, then cgroup v1, then the unprivileged fallback.

An operator who names a backend gets that one or a BackendError saying why it
cannot work here; only the automatic choice falls back, with a WARNING that says
what is lost.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from controller.backends.affinity import AffinityBackend
from controller.backends.base import BackendError, ResourceBackend
from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.backends.cgroup_v2 import CgroupV2Backend

log = logging.getLogger(__name__)

BACKEND_NAMES = ("cgroup-v1", "cgroup-v2", "affinity")


def detect_backend(
    prefer: str | None = None,
    group: str = "adloader",
    root: Path = Path("/sys/fs/cgroup"),
    proc: Path = Path("/proc"),
) -> ResourceBackend:
    """The backend named by ``prefer`` (or the best one available when None). Raises BackendError."""
    root = Path(root)
    if prefer is None:
        return _auto(group, root, proc)
    if prefer == "cgroup-v2":
        problem = v2_problem(root)
        if problem:
            raise BackendError(f"--backend cgroup-v2 cannot work here: {problem}")
        return CgroupV2Backend(group, root, proc)
    if prefer == "cgroup-v1":
        problem = v1_problem(root)
        if problem:
            raise BackendError(f"--backend cgroup-v1 cannot work here: {problem}")
        return CgroupV1Backend(group, root, proc)
    if prefer == "affinity":
        return AffinityBackend(proc)
    raise BackendError(f"unknown backend {prefer!r}: choose one of {', '.join(BACKEND_NAMES)}, or leave it out to detect")


def _auto(group: str, root: Path, proc: Path) -> ResourceBackend:
    v2_why = v2_problem(root)
    if not v2_why:
        log.info("using the cgroup-v2 backend at %s", root)
        return CgroupV2Backend(group, root, proc)
    v1_why = v1_problem(root)
    if not v1_why:
        log.info("using the cgroup-v1 backend at %s (cgroup v2 not usable: %s)", root, v2_why)
        return CgroupV1Backend(group, root, proc)
    log.warning(
        "no writable cgroups (v2: %s; v1: %s): falling back to CPU affinity only. CPU quotas and read "
        "bandwidth throttles are NOT enforced and jobs are only confined to CPUs; run `adloader controller` "
        "as root on a host with cgroups mounted read-write to enforce them",
        v2_why,
        v1_why,
    )
    return AffinityBackend(proc)


def v2_problem(root: Path) -> str | None:
    """Why the cgroup v2 backend cannot enforce CPU quotas at ``root``, or None if it can."""
    controllers_file = root / "cgroup.controllers"
    try:
        controllers = controllers_file.read_text().split()
    except OSError:
        return f"{root} is not a cgroup2 mount (no readable {controllers_file.name})"
    if "cpu" not in controllers:
        return f"the cpu controller is not in {controllers_file} (it offers: {' '.join(controllers) or 'nothing'})"
    if not os.access(root / "cgroup.subtree_control", os.W_OK):
        return f"{root / 'cgroup.subtree_control'} is not writable: run as root, or get a delegated subtree"
    return None


def v1_problem(root: Path) -> str | None:
    """Why the cgroup v1 backend cannot enforce CPU quotas at ``root``, or None if it can."""
    quota_file = root / "cpu" / "cpu.cfs_quota_us"
    if not quota_file.is_file():
        return f"no cgroup v1 cpu hierarchy ({quota_file} is missing)"
    if not os.access(quota_file, os.W_OK) or not os.access(root / "cpu", os.W_OK):
        return f"{quota_file} is not writable: run as root"
    return None
