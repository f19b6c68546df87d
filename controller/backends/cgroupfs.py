"""What the cgroup v1 and v2 backends share: names, value checks, kernel errors, removal.

Kernel errors become BackendError here, with the file that refused and what the
operator can do about it, so every backend reports failures the same way.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from adloader.cpuspec import CpuSpecError, parse_cpus
from controller.backends.base import BackendError
from controller.backends.placement import cgroups_of

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
"""The scheduler period every job group uses (the kernel default); quotas are cores x period."""
MIN_QUOTA_US = 1_000
"""The kernel refuses CFS quotas under 1 ms."""
_REMOVE_ATTEMPTS = 8
"""rmdir is retried this often when a process forks into the group while it is drained."""
_REMOVE_BACKOFF_S = (0.02, 0.5)
"""Between attempts, waits doubling from the first to at most the second (about 2 s in all): a
process killed just before the drain stays in its group until it has exited, and an
immediate retry found it there still (a CI run under load: EBUSY after five retries)."""

PLACEMENT_REFRESH_S = 5.0
"""How long what a scheduler set on a job's parent cgroup (its cpuset, the controllers it
delegates) is taken as read: schedulers change it rarely (Slurm never after the job starts,
kubelet's CPU manager on its own 10 s reconcile), and placement() is asked for three times a
job in every control step and once more for the status."""

T = TypeVar("T")


class RereadEvery:
    """Values read from the kernel at most once every ``refresh_s`` per key."""

    def __init__(self, clock: Callable[[], float], refresh_s: float = PLACEMENT_REFRESH_S) -> None:
        self._clock = clock
        self._refresh_s = refresh_s
        self._values: dict[object, tuple[float, object]] = {}

    def get(self, key: object, read: Callable[[], T]) -> T:
        """The value of ``key`` read within ``refresh_s``, else ``read()`` now (stale keys of
        jobs long gone are dropped at the same time)."""
        now = self._clock()
        cached = self._values.get(key)
        if cached is not None and now - cached[0] < self._refresh_s:
            return cached[1]  # type: ignore[return-value]
        self._values = {k: v for k, v in self._values.items() if now - v[0] < self._refresh_s}
        value = read()
        self._values[key] = (now, value)
        return value


def read_cpus(path: Path) -> tuple[int, ...] | None:
    """The CPU list in a cpuset file (``cpuset.effective_cpus``, ``cpuset.cpus.effective``);
    None when it cannot be read or parsed."""
    try:
        return parse_cpus(path.read_text())
    except (OSError, CpuSpecError):
        return None


def tightest_quota(directory: Path, top: Path, read_quota: Callable[[Path], float | None]) -> float | None:
    """The tightest CPU quota, in cores, that ``read_quota`` finds on ``directory`` or an
    ancestor below ``top`` (a pod's limit may sit on its pod's cgroup, above its container's);
    None where none is set."""
    limits = []
    while directory != top and top in directory.parents:
        quota = read_quota(directory)
        if quota is not None:
            limits.append(quota)
        directory = directory.parent
    return min(limits, default=None)


def cpu_limit(quota: float | None, allowed_cpus: tuple[int, ...] | None) -> float | None:
    """The most cores a job can use where its scheduler placed it: its quota above, and the
    CPUs its cpuset allows; None where neither is known."""
    if not allowed_cpus:
        return quota
    return float(len(allowed_cpus)) if quota is None else min(quota, float(len(allowed_cpus)))


_REMEDIES = {
    errno.ENOENT: "the group or its controller file is missing: create the job's group first, "
    "and check that the controller is mounted/enabled",
    errno.EACCES: "permission denied: run `adloader controller` as root, or use --backend affinity",
    errno.EPERM: "not permitted: run `adloader controller` as root, or use --backend affinity",
    errno.EROFS: "the cgroup filesystem is read-only (a container?): mount it read-write, or use --backend affinity",
    errno.ESRCH: "the process has already exited",
    errno.ENOSPC: "the cpuset has no CPUs or memory nodes: set cpuset.cpus and cpuset.mems first",
    errno.EINVAL: "the kernel refused the value: check it is in range for this file",
    errno.ENODEV: "no such block device: pass the MAJ:MIN of a disk listed in /sys/dev/block",
    errno.EBUSY: "the group is still in use (processes or child groups inside)",
}


def kernel_error(exc: OSError, path: Path | str, action: str) -> BackendError:
    """The BackendError for an OSError raised while touching ``path``: which file, what failed, what to do."""
    remedy = _REMEDIES.get(exc.errno or 0, "see the kernel log (dmesg) for details")
    return BackendError(f"{action} failed at {os.fsdecode(path)}: {exc.strerror or exc}; {remedy}")


@contextmanager
def kernel_call(path: Path | str, action: str) -> Iterator[None]:
    """Turn an OSError raised while touching ``path`` into kernel_error's BackendError."""
    try:
        yield
    except OSError as exc:
        raise kernel_error(exc, path, action) from exc


def check_name(name: str, what: str = "job id") -> str:
    """A job id or group name becomes one directory name: refuse anything that is not a plain name."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or name.startswith("cgroup."):
        raise BackendError(f"{what} {name!r} cannot name a cgroup directory: use letters, digits, '-', '_' or '.'")
    return name


def parse_device(device: str) -> tuple[int, int]:
    """``"254:0"`` -> ``(254, 0)``; BackendError for anything else."""
    major, colon, minor = device.strip().partition(":")
    if not colon or not major.isdigit() or not minor.isdigit():
        raise BackendError(f"block device {device!r} is not MAJ:MIN (e.g. 254:0; `lsblk -o NAME,MAJ:MIN` lists them)")
    return int(major), int(minor)


def quota_us(cores: float) -> int:
    """CFS quota for ``cores`` CPUs' worth of time per CFS_PERIOD_US (at least the kernel minimum)."""
    if not cores > 0:
        raise BackendError(f"a CPU quota of {cores} cores is not positive: give > 0, or None to remove the limit")
    return max(MIN_QUOTA_US, round(cores * CFS_PERIOD_US))


DEFAULT_CPU_WEIGHT = 100
"""cgroup v2's default cpu.weight (v1: cpu.shares 1024)."""


def check_weight(weight: int | None) -> int:
    """A cpu.weight value (1-10000); None is the default. BackendError outside the range."""
    if weight is None:
        return DEFAULT_CPU_WEIGHT
    if not 1 <= weight <= 10_000:
        raise BackendError(f"CPU weight {weight} is outside 1-10000 (cgroup v2 cpu.weight's range)")
    return weight


def shares_of(weight: int | None) -> int:
    """v1 cpu.shares for a cpu.weight-scale ``weight`` (100 -> 1024, the kernels' defaults)."""
    return max(2, round(check_weight(weight) * 1024 / DEFAULT_CPU_WEIGHT))


def check_bps(bps: int) -> int:
    if bps <= 0:
        raise BackendError(f"read throttle of {bps} bytes/s is not positive: give > 0, or None to remove it")
    return int(bps)


def write_interface(path: Path, text: str, action: str) -> None:
    """One write() to an existing kernel interface file (never creates it, as the kernel would not)."""
    with kernel_call(path, action):
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # kernfs ignores O_TRUNC; a fixture file needs it
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def read_interface(path: Path, action: str) -> str:
    with kernel_call(path, action):
        return path.read_text()


def group_gone(exc: OSError) -> bool:
    """True when reading a group's file failed because the group is gone: ENOENT once it is
    removed, ENODEV when it was removed between the file's open and its read (as a job departs
    while another process reads its limits)."""
    return exc.errno in (errno.ENOENT, errno.ENODEV)


def read_pid_list(path: Path) -> set[int]:
    """Pids listed in a cgroup.procs file; an empty set if the group is gone."""
    try:
        return {int(line) for line in path.read_text().split()}
    except OSError as exc:
        if group_gone(exc):
            return set()
        raise


def job_from_proc_cgroup(proc: Path, pid: int, group: str, hierarchy: str) -> str | None:
    """The job id whose group holds ``pid`` in ``hierarchy`` (a controller name, or
    placement.UNIFIED for cgroup v2), read from /proc/PID/cgroup; None if it is in no job group."""
    path = cgroups_of(pid, proc).get(hierarchy)
    if path is None:
        return None
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[-2] == group:  # nested placement: <scheduler's cgroup>/<group>/<job>
        return parts[-1]
    return None


def remove_if_unused(directory: Path) -> None:
    """rmdir ``directory`` (a group that held job groups) if no job group is left in it.
    A group still in use stays: rmdir refuses it, which is not an error here."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise kernel_error(exc, directory, "removing the empty group") from exc


def drain_and_rmdir(job_dir: Path, pids: Callable[[], set[int]], move: Callable[[int], None],
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Move every pid out of ``job_dir`` (``move``), then remove it; a missing group is already removed.

    A process that forks while the group is drained leaves a new child behind, and one that
    is still exiting stays listed, and either makes rmdir fail with EBUSY, so drain and rmdir
    are retried with a short backoff (``_REMOVE_BACKOFF_S``).
    """
    for attempt in range(1, _REMOVE_ATTEMPTS + 1):
        for pid in pids():
            try:
                move(pid)
            except BackendError as exc:
                if isinstance(exc.__cause__, ProcessLookupError):
                    continue
                raise
        try:
            os.rmdir(job_dir)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == _REMOVE_ATTEMPTS:
                raise kernel_error(exc, job_dir, "removing the job's group") from exc
            log.debug("%s still busy after draining (attempt %d), retrying", job_dir, attempt)
            first, most = _REMOVE_BACKOFF_S
            sleep(min(most, first * 2 ** (attempt - 1)))
