"""The controller's checkpoint: which jobs it manages and what each was given, on disk.

Written atomically (temp file in the same directory, fsync, rename, fsync the
directory) with a version and a sha256 checksum of the canonical payload, so a
crash leaves either the old file or the new one. Loading never raises for bad
content: a truncated, corrupt or unknown file is moved aside as
``state.json.corrupt-<timestamp>`` and reported, and the controller rebuilds its
state from the cgroup tree instead of crash-looping.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from adloader.errors import AdloaderError
from controller import faults
from controller.policies.base import JobAllocation

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILE = "state.json"
TEMP_FILE = STATE_FILE + ".tmp"
_FORMAT = "adloader-controller-state"


class StateWriteError(AdloaderError):
    """The state file could not be written (disk full, read-only, permissions)."""


@dataclass(frozen=True)
class PersistedJob:
    job_id: str
    name: str
    uid: int
    gpus: int
    launcher_pid: int
    registered_at: float
    cgroup: str
    allocation: JobAllocation
    requested_workers: int | None
    features: dict[str, float] | None
    remaining_samples: float | None = None


@dataclass(frozen=True)
class ControllerState:
    version: int
    policy: str
    jobs: dict[str, PersistedJob]
    saved_at: float


@dataclass(frozen=True)
class LoadResult:
    state: ControllerState | None
    """None when there was no file or it was unusable."""
    problem: str | None
    """What was wrong with the file (it has been moved aside), or None."""


class _BadState(Exception):
    """Internal: the file's content is unusable; the message says why."""


class StateStore:
    """Saves and loads ``<directory>/state.json``."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self._clock = clock

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def save(self, state: ControllerState) -> ControllerState:
        """Write ``state`` (stamped with saved_at = now) atomically; returns what was written.

        Raises StateWriteError if the directory cannot take the file; the previous file stays intact.
        """
        stamped = replace(state, saved_at=self._clock())
        payload = _to_payload(stamped)
        document = {"format": _FORMAT, "version": stamped.version, "checksum": _checksum(payload), "payload": payload}
        data = (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()
        temp = self.directory / TEMP_FILE
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
                file.write(data)  # a buffered write: a short write is retried, never left truncated
                file.flush()
                os.fsync(file.fileno())
            faults.hit("state.after_temp_write")
            os.replace(temp, self.path)
            _fsync_directory(self.directory)
        except OSError as exc:
            with suppress(OSError):
                temp.unlink(missing_ok=True)
            raise StateWriteError(
                f"cannot write the controller state to {self.path}: {exc.strerror or exc}. The controller keeps "
                f"running on the state in memory; free space on that filesystem or make {self.directory} writable "
                "(or move it with --state-dir), and the next save will succeed"
            ) from exc
        return stamped

    def load(self) -> LoadResult:
        """The saved state; (None, None) if there is none; (None, problem) if it was unusable (moved aside)."""
        self._remove_leftover_temp()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return LoadResult(None, None)
        except OSError as exc:
            return LoadResult(None, self._set_aside(f"unreadable: {exc.strerror or exc}"))
        try:
            return LoadResult(_parse(raw), None)
        except _BadState as exc:
            return LoadResult(None, self._set_aside(str(exc)))

    def _remove_leftover_temp(self) -> None:
        temp = self.directory / TEMP_FILE
        if temp.exists():
            log.warning("removing %s left by a save that did not finish (crash during a state write)", temp)
            try:
                temp.unlink()
            except OSError as exc:
                log.warning("could not remove %s: %s", temp, exc.strerror)

    def _set_aside(self, problem: str) -> str:
        """Move the bad file to state.json.corrupt-<timestamp>; returns the problem text, saying where it went."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._clock()))
        target = self.directory / f"{STATE_FILE}.corrupt-{stamp}"
        suffix = 1
        while target.exists():
            target = self.directory / f"{STATE_FILE}.corrupt-{stamp}-{suffix}"
            suffix += 1
        try:
            os.replace(self.path, target)
            where = f"moved aside to {target}"
        except OSError as exc:
            where = f"could not be moved aside ({exc.strerror}); it will be overwritten by the next save"
        message = f"state file {self.path} is unusable ({problem}); {where}"
        log.error("%s; rebuilding state from the cgroup tree and live processes", message)
        return message


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _canonical(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def _checksum(payload: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical(payload)).hexdigest()


def _to_payload(state: ControllerState) -> dict[str, Any]:
    return {
        "version": state.version,
        "policy": state.policy,
        "saved_at": state.saved_at,
        "jobs": {job_id: asdict(job) for job_id, job in state.jobs.items()},
    }


def _parse(raw: bytes) -> ControllerState:
    """The state in ``raw``; _BadState saying what is wrong otherwise."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _BadState(f"not valid JSON ({len(raw)} bytes; truncated?): {exc}") from None
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise _BadState("not an adloader state file (no 'format' marker)")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _BadState(f"version {version!r} is not an integer")
    if version > STATE_VERSION:
        raise _BadState(f"written by a newer adloader (state version {version}, this one reads up to {STATE_VERSION})")
    payload = document.get("payload")
    if not isinstance(payload, dict):
        raise _BadState("no payload object")
    actual = _checksum(payload)
    if document.get("checksum") != actual:
        raise _BadState(f"checksum mismatch (file says {document.get('checksum')!r}, content is {actual})")
    return _state_from_payload(payload, version)


def _state_from_payload(payload: dict[str, Any], version: int) -> ControllerState:
    reader = _Reader(payload, "payload")
    jobs_raw = reader.get("jobs", dict)
    jobs = {}
    for job_id, raw_job in jobs_raw.items():
        job = _Reader(raw_job, f"jobs.{job_id}")
        jobs[job_id] = PersistedJob(
            job_id=job.get("job_id", str),
            name=job.get("name", str),
            uid=job.get("uid", int),
            gpus=job.get("gpus", int),
            launcher_pid=job.get("launcher_pid", int),
            registered_at=job.get("registered_at", float),
            cgroup=job.get("cgroup", str),
            allocation=_allocation(_Reader(job.get("allocation", dict), f"jobs.{job_id}.allocation")),
            requested_workers=job.get("requested_workers", int, optional=True),
            features=_features(job.get("features", dict, optional=True), f"jobs.{job_id}.features"),
            remaining_samples=job.get("remaining_samples", float, optional=True),
        )
        if jobs[job_id].job_id != job_id:
            raise _BadState(f"wrong shape: jobs.{job_id} holds job {jobs[job_id].job_id!r}")
    return ControllerState(
        version=version,
        policy=reader.get("policy", str),
        jobs=jobs,
        saved_at=reader.get("saved_at", float),
    )


def _allocation(reader: "_Reader") -> JobAllocation:
    cpus = reader.get("cpus", list, optional=True)
    if cpus is not None and not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus):
        raise _BadState(f"wrong shape: {reader.where}.cpus is not a list of CPU ids")
    read_bps = reader.get("read_bps", float, optional=True)  # a policy may hand out a float rate
    return JobAllocation(
        cores=reader.get("cores", float, optional=True),
        cpus=tuple(cpus) if cpus is not None else None,
        read_bps=None if read_bps is None else round(read_bps),
        workers=reader.get("workers", int, optional=True),
    )


def _features(raw: dict | None, where: str) -> dict[str, float] | None:
    if raw is None:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw.values()):
        raise _BadState(f"wrong shape: {where} has a value that is not a number")
    return {key: float(value) for key, value in raw.items()}


class _Reader:
    """Typed access to one JSON object; a missing key or wrong type is a _BadState naming the field."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise _BadState(f"wrong shape: {where} is not an object")
        self._raw = raw
        self.where = where

    def get(self, key: str, kind: type, optional: bool = False) -> Any:
        if key not in self._raw:
            raise _BadState(f"wrong shape: {self.where}.{key} is missing")
        value = self._raw[key]
        if value is None and optional:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise _BadState(f"wrong shape: {self.where}.{key} is {type(value).__name__}, expected {kind.__name__}")
        return value
