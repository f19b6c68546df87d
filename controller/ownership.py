"""One owner per cgroup group and per state directory: exclusive locks a controller holds
while it runs.

Two controllers on one group would adopt each other's jobs and, at the first one's
SIGTERM, lift the limits of jobs the other still manages. So a controller takes an
exclusive ``flock`` on a lock file named after its group (in a lock directory that does
not depend on ``--socket``) and one in its state directory, before it touches either,
and keeps them until it exits; the kernel drops them if it dies. The file holds who
took it, so the refusal names the holder.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from adloader.errors import AdloaderError

log = logging.getLogger(__name__)


UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT)
"""A full or read-only file system: the controller runs on (as with its state file) and says so."""


class OwnershipError(AdloaderError):
    """Another live controller holds the lock on a group or state directory."""


@dataclass(frozen=True)
class Holder:
    """What a lock file says about the controller holding it."""

    pid: int
    socket: str
    state_dir: str
    group: str

    def describe(self) -> str:
        return f"controller pid {self.pid} (socket {self.socket}, state dir {self.state_dir}, group {self.group})"


class ExclusiveLock:
    """An exclusive, non-blocking ``flock`` on ``path``, with the holder written inside.

    Released by :meth:`release` (which removes the file while still holding it) or by the
    process's death. A file removed by a releasing holder between our open and our lock
    is noticed (its inode no longer matches the path) and the lock is taken again."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self._fd: int | None = None

    def acquire(self, holder: Holder) -> None:
        """Take the lock and record ``holder``; OwnershipError naming the current holder if taken."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            # Held read-only: an open writable file would keep the state directory's file system
            # from being remounted read-only (a fault the controller must survive).
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno not in UNWRITABLE:
                    raise
                # Nothing can be written there, state included: no second owner can do harm.
                log.warning("cannot create %s (%s): %s is not locked", self.path, exc.strerror, self.what)
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                current = _read_holder(fd)
                os.close(fd)
                who = current.describe() if current else "another controller (it has not written its name yet)"
                stop = f"stop it (kill -TERM {current.pid}, or systemctl stop adloader-controller)" if current \
                    else "stop it"
                raise OwnershipError(
                    f"{self.what} is already managed by {who}; {stop}, or give this controller another "
                    "--cgroup-group and --state-dir") from None
            try:
                same_file = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # the holder removed it while releasing: lock the new file
        self._fd = fd
        try:
            with open(self.path, "w", encoding="utf-8") as record:  # written once, closed at once
                record.write(json.dumps(holder.__dict__) + "\n")
        except OSError as exc:
            if exc.errno not in UNWRITABLE:
                raise
            log.warning("holding %s without naming this controller in it: %s", self.path, exc.strerror)

    def release(self) -> None:
        """Remove the lock file and drop the lock (in that order, so no one locks a removed file)."""
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> Holder | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return Holder(**data) if isinstance(data, dict) else None
    except (ValueError, TypeError, OSError):
        return None


class Ownership:
    """The two locks a controller holds: its group's and its state directory's."""

    STATE_LOCK_NAME = "controller.lock"

    def __init__(self, lock_dir: Path, group: str, state_dir: Path) -> None:
        self.group_lock = ExclusiveLock(Path(lock_dir) / f"group-{quote(group, safe='')}.lock", f"cgroup group {group!r}")
        self.state_lock = ExclusiveLock(Path(state_dir) / self.STATE_LOCK_NAME, f"state directory {state_dir}")

    def acquire(self, holder: Holder) -> None:
        """Both locks, or neither (OwnershipError)."""
        self.group_lock.acquire(holder)
        try:
            self.state_lock.acquire(holder)
        except BaseException:
            self.group_lock.release()
            raise
        log.debug("holding %s and %s", self.group_lock.path, self.state_lock.path)

    def release(self) -> None:
        self.state_lock.release()
        self.group_lock.release()
