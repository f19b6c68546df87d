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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from adloader.errors import AdloaderError, ProtocolError
from adloader.protocol import decode_object, plain
from controller import faults
from controller.policies.base import JobAllocation

log = logging.getLogger(__name__)

STATE_VERSION = 2
"""2: wanted and applied allocations and the learnt model per job (1 had one ``allocation``)."""
STATE_FILE = "state.json"
TEMP_FILE = STATE_FILE + ".tmp"
_FORMAT = "adloader-controller-state"


class StateWriteError(AdloaderError):
    """The state file could not be written (disk full, read-only, permissions)."""


@dataclass(frozen=True)
class LearntModel:
    """What the controller measured of a job's model, so that a restarted controller plans
    with it from its first step instead of relearning from even shares."""

    max_throughput: float | None = None
    """Measured M, samples/s (None: not measured yet)."""
    cpu_s_per_sample: float | None = None
    """Measured p: loader CPU seconds per sample."""
    bytes_per_sample: float | None = None
    """Measured b: bytes read from storage per sample."""
    loading_observations: tuple[tuple[float, float], ...] = ()
    """The loading curve's (cores used, samples/s) windows, oldest first, warm-up excluded."""


@dataclass(frozen=True)
class PersistedJob:
    job_id: str
    name: str
    uid: int
    gpus: int
    launcher_pid: int
    registered_at: float
    cgroup: str
    wanted: JobAllocation
    """The policy's latest decision."""
    applied: JobAllocation
    """What the kernel was given (the reconciler's record); a restart plans from it."""
    requested_workers: int | None
    features: dict[str, float] | None
    remaining_samples: float | None = None
    model: LearntModel = LearntModel()
    pinned_workers: int | None = None
    """Workers, all ranks, an operator pinned the job to (``adloader workers``); None: the policy's."""
    declared_samples: int | None = None
    """The length the job declared at registration: the history records it when the job ends."""


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
        data = _document(_to_payload(stamped), stamped.version)
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
    return _checksum_of(_canonical(payload))


def _checksum_of(canonical: bytes) -> str:
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _document(payload: dict[str, Any], version: int) -> bytes:
    """The file: format, version, the payload's checksum and the payload, as one line of canonical
    JSON. The payload is encoded once, for the checksum and the file both: with 16 jobs a save
    took 13 ms of CPU when it was encoded twice (once indented) and the controller saves every
    allocation change. ``python -m json.tool state.json`` shows it indented."""
    canonical = _canonical(payload)
    head = json.dumps({"checksum": _checksum_of(canonical), "format": _FORMAT}, sort_keys=True,
                      separators=(",", ":"))
    return b"".join((head[:-1].encode(), b',"payload":', canonical, f',"version":{version}}}\n'.encode()))


def _to_payload(state: ControllerState) -> dict[str, Any]:
    jobs = {job_id: replace(job, wanted=_whole_rates(job.wanted), applied=_whole_rates(job.applied))
            for job_id, job in state.jobs.items()}
    return plain(replace(state, jobs=jobs))


def _whole_rates(allocation: JobAllocation) -> JobAllocation:
    """A policy may hand out a float read rate; the file (and the kernel) hold whole bytes/s."""
    if allocation.read_bps is None or isinstance(allocation.read_bps, int):
        return allocation
    return replace(allocation, read_bps=round(allocation.read_bps))


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
    """The typed decoder of the wire protocol builds every field, nested ones included."""
    if version == 1:
        payload = _from_version_1(payload)
    try:
        state = decode_object(ControllerState, {**payload, "version": version}, "payload")
    except ProtocolError as exc:
        raise _BadState(f"wrong shape: {exc}") from None
    for job_id, job in state.jobs.items():
        if job.job_id != job_id:
            raise _BadState(f"wrong shape: jobs.{job_id} holds job {job.job_id!r}")
        for name, allocation in (("wanted", job.wanted), ("applied", job.applied)):
            if allocation.cpus is not None and any(cpu < 0 for cpu in allocation.cpus):
                raise _BadState(f"wrong shape: jobs.{job_id}.{name}.cpus holds a negative CPU id")
    return state


def _from_version_1(payload: dict[str, Any]) -> dict[str, Any]:
    """A version-1 payload kept one ``allocation`` per job: it was both wanted and applied."""
    jobs = payload.get("jobs")
    if not isinstance(jobs, dict):
        return payload
    upgraded = {}
    for job_id, job in jobs.items():
        if isinstance(job, dict) and "allocation" in job:
            job = {key: value for key, value in job.items() if key != "allocation"}
            job["wanted"] = job["applied"] = jobs[job_id]["allocation"]
        upgraded[job_id] = job
    return {**payload, "jobs": upgraded}
