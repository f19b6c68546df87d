"""The node's job history: what finished jobs measured, so recurring jobs start informed.

Most training jobs recur (A-SRPT's observation): the same script with the same model
and batch size, day after day. A finished job's features, predicted and measured
max throughput M, loader CPU seconds p and bytes b per sample, sample count, duration,
loading curve and exit status go into an SQLite file in the controller's state
directory. A job that registers again with the same name and features gets its
expected length and its curves from here, and the predictor corrects its model with
the ratios of measured to predicted M of everything this node has run.

Only a run that completed (exit code 0) says how long the job is: a run that failed,
was killed, or whose launcher vanished without telling its exit code, stopped at some
sample count that is not the job's length. Its measurements of M, p, b and the loading
curve still count: they were measured while it ran.

SQLite from the standard library; one short connection per call (the controller calls
this a few times per job, never per control step). A corrupt file is moved aside and a
fresh one started: history is an optimisation, never a reason to stop.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import sqlite3
import statistics
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from controller.snapshot import JobSnapshot

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
"""2 added ``exit_code``, 3 ``declared_samples``; older files are migrated, what they did not
record unknown (NULL)."""
MAX_RECORDS = 20000
"""Oldest records beyond this many are dropped."""
VOLATILE_FEATURES = frozenset({"gpus", "allreduce_bytes"})
"""Features that change with how a job is launched, not what it trains: left out of the identity."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    features_key TEXT,
    features TEXT,
    device TEXT NOT NULL DEFAULT '',
    gpus INTEGER NOT NULL,
    batch_size INTEGER,
    predicted_sps REAL,
    measured_sps REAL,
    cpu_s_per_sample REAL,
    bytes_per_sample REAL,
    samples INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    loading_curve TEXT NOT NULL DEFAULT '[]',
    finished_at REAL NOT NULL,
    exit_code INTEGER,
    declared_samples INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_identity ON jobs (name, features_key);
CREATE INDEX IF NOT EXISTS jobs_features ON jobs (features_key);
"""


@dataclass(frozen=True)
class FinishedJob:
    """One finished job, as recorded."""

    job_id: str
    name: str
    gpus: int
    samples: int
    duration_s: float
    finished_at: float
    features: dict[str, float] | None = None
    device: str = ""
    """What the predictor called this node's device ("cpu", "H100"...)."""
    batch_size: int | None = None
    predicted_sps: float | None = None
    measured_sps: float | None = None
    cpu_s_per_sample: float | None = None
    bytes_per_sample: float | None = None
    loading_curve: tuple[tuple[float, float], ...] = ()
    """(cores, loading samples/s) knots of the job's fitted loading curve."""
    exit_code: int | None = None
    """The command's exit code as the launcher reported it (128+N: killed by signal N);
    None when the launcher went away without reporting one."""
    declared_samples: int | None = None
    """The length the job declared at registration (``adloader run --samples``); None: none."""

    @property
    def completed(self) -> bool:
        """The run finished its work: only such runs say how long the job is."""
        return self.exit_code == 0

    @classmethod
    def from_snapshot(
        cls,
        snapshot: JobSnapshot,
        *,
        exit_code: int | None = None,
        features: Mapping[str, float] | None = None,
        loading_curve: Sequence[tuple[float, float]] = (),
        device: str = "",
        finished_at: float | None = None,
        declared_samples: int | None = None,
    ) -> "FinishedJob":
        """Build the record from the registry's final snapshot of the job. ``features`` and
        ``loading_curve`` default to the snapshot's own when it carries them."""
        finished = time.time() if finished_at is None else finished_at
        samples = int(snapshot.samples_total)
        features = features if features is not None else getattr(snapshot, "features", None)
        curve = loading_curve or getattr(snapshot, "loading_curve", ()) or ()
        return cls(
            job_id=snapshot.job_id,
            name=snapshot.name,
            gpus=snapshot.gpus,
            samples=samples,
            duration_s=max(0.0, finished - snapshot.registered_at),
            finished_at=finished,
            features=dict(features) if features else None,
            device=device,
            batch_size=snapshot.batch_size,
            predicted_sps=snapshot.max_sps_predicted,
            measured_sps=snapshot.max_sps_measured,
            cpu_s_per_sample=snapshot.loader_cpu_seconds_total / samples if samples else None,
            bytes_per_sample=snapshot.read_bytes_total / samples if samples else None,
            loading_curve=tuple((float(c), float(s)) for c, s in curve),
            exit_code=exit_code,
            declared_samples=declared_samples,
        )


@dataclass(frozen=True)
class HistoryEstimate:
    """What earlier runs of a job say about this one (medians over the matching runs; the
    length over the completed ones only)."""

    runs: int
    completed_runs: int
    samples: float | None
    """Samples of a completed run; None when no earlier run completed."""
    duration_s: float | None
    max_throughput: float | None
    """M in samples/s measured by earlier runs (at ``gpus`` GPUs)."""
    max_throughput_range: tuple[float, float] | None
    gpus: int
    cpu_s_per_sample: float | None
    bytes_per_sample: float | None
    loading_curve: tuple[tuple[float, float], ...]
    """The latest run's loading curve knots; empty when none was recorded."""


@dataclass(frozen=True)
class HistoryRecord:
    """A stored job, as the predictor's correction reads it."""

    name: str
    features: dict[str, float] | None
    device: str
    gpus: int
    predicted_sps: float | None
    measured_sps: float | None


def features_key(features: Mapping[str, float] | None) -> str | None:
    """A stable identity for a feature dict: values to 6 significant digits, launch-dependent
    keys left out. None for no features."""
    if not features:
        return None
    canonical = {k: float(f"{float(v):.6g}") for k, v in sorted(features.items()) if k not in VOLATILE_FEATURES}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:24]


class JobHistory:
    """Finished jobs in an SQLite file; see the module docstring."""

    def __init__(self, path: Path, max_records: int = MAX_RECORDS) -> None:
        self.path = Path(path)
        self.max_records = max_records
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._ensure_schema()

    # ------------------------------------------------------------------ storage

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=5.0)
        connection.row_factory = sqlite3.Row
        return connection

    def _ensure_schema(self) -> None:
        try:
            self._create()
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.warning("job history %s is unreadable (%s); moved it to %s and started a new one",
                        self.path, exc, aside)
            self.path.replace(aside)
            self._create()

    def _create(self) -> None:
        with closing(self._connect()) as connection, connection:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, 2, SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {version}, this controller writes {SCHEMA_VERSION}")
            if version == 1:  # runs recorded before exit codes were: their status stays unknown (NULL)
                connection.execute("ALTER TABLE jobs ADD COLUMN exit_code INTEGER")
            if version in (1, 2):  # runs recorded before declared lengths were: unknown (NULL)
                connection.execute("ALTER TABLE jobs ADD COLUMN declared_samples INTEGER")
            connection.executescript(_SCHEMA)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ------------------------------------------------------------------ writing

    def record(self, finished: FinishedJob) -> None:
        """Store one finished job (and drop the oldest beyond ``max_records``)."""
        row = (
            finished.job_id, finished.name, features_key(finished.features),
            json.dumps(finished.features) if finished.features else None, finished.device, finished.gpus,
            finished.batch_size, _finite(finished.predicted_sps), _finite(finished.measured_sps),
            _finite(finished.cpu_s_per_sample), _finite(finished.bytes_per_sample), finished.samples,
            finished.duration_s, json.dumps([list(p) for p in finished.loading_curve]), finished.finished_at,
            finished.exit_code, finished.declared_samples,
        )
        with closing(self._connect()) as connection, connection:
            connection.execute(
                "INSERT INTO jobs (job_id, name, features_key, features, device, gpus, batch_size, predicted_sps,"
                " measured_sps, cpu_s_per_sample, bytes_per_sample, samples, duration_s, loading_curve, finished_at,"
                " exit_code, declared_samples) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            connection.execute(
                "DELETE FROM jobs WHERE id <= (SELECT id FROM jobs ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.max_records,))
        log.info("job history: recorded %s (%s): %s, %d samples in %.0f s, M measured %s", finished.job_id,
                 finished.name, _outcome(finished.exit_code), finished.samples, finished.duration_s,
                 f"{finished.measured_sps:.1f}/s" if finished.measured_sps else "unknown")

    # ------------------------------------------------------------------ reading

    def lookup(self, name: str, features: Mapping[str, float] | None) -> HistoryEstimate | None:
        """Earlier runs of the job ``name`` with the same features (any features when None);
        None when it never ran here. Runs that processed no sample are ignored; the length
        comes from completed runs only."""
        key = features_key(features)
        query = "SELECT * FROM jobs WHERE name = ? AND samples > 0"
        params: tuple[Any, ...] = (name,)
        if key is not None:
            query += " AND features_key = ?"
            params += (key,)
        with closing(self._connect()) as connection:
            rows = connection.execute(query + " ORDER BY id", params).fetchall()
        return _estimate(rows) if rows else None

    def lookup_features(self, features: Mapping[str, float], gpus: int, device: str = "") -> HistoryEstimate | None:
        """Earlier runs with exactly these features on ``gpus`` GPUs of ``device``, whatever their
        name (the predictor is not told names); None when there are none with a measured M."""
        key = features_key(features)
        if key is None:
            return None
        with closing(self._connect()) as connection:
            rows = connection.execute(
                "SELECT * FROM jobs WHERE features_key = ? AND gpus = ? AND device = ? AND measured_sps > 0 "
                "ORDER BY id", (key, gpus, device)).fetchall()
        return _estimate(rows) if rows else None

    def records(self, device: str | None = None, limit: int = 500) -> list[HistoryRecord]:
        """The latest ``limit`` records with features and a measured M (of ``device`` if given)."""
        query = "SELECT * FROM jobs WHERE features IS NOT NULL AND measured_sps > 0"
        params: tuple[Any, ...] = ()
        if device is not None:
            query += " AND device = ?"
            params = (device,)
        with closing(self._connect()) as connection:
            rows = connection.execute(query + " ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [HistoryRecord(r["name"], json.loads(r["features"]), r["device"], r["gpus"], r["predicted_sps"],
                              r["measured_sps"]) for r in rows]

    def completed_runs(self, limit: int = 2000) -> list[FinishedJob]:
        """The latest ``limit`` runs that completed (exit code 0): only they say how long a job
        is (what the remaining-length forest learns from, controller/remaining.py)."""
        with closing(self._connect()) as connection:
            rows = connection.execute("SELECT * FROM jobs WHERE exit_code = 0 AND samples > 0 ORDER BY id DESC LIMIT ?",
                                      (limit,)).fetchall()
        return [_finished(r) for r in rows]

    def __len__(self) -> int:
        with closing(self._connect()) as connection:
            return int(connection.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])

    def __iter__(self) -> Iterator[FinishedJob]:
        with closing(self._connect()) as connection:
            rows = connection.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        for r in rows:
            yield _finished(r)


def _finished(r: sqlite3.Row) -> FinishedJob:
    return FinishedJob(
        job_id=r["job_id"], name=r["name"], gpus=r["gpus"], samples=r["samples"], duration_s=r["duration_s"],
        finished_at=r["finished_at"], features=json.loads(r["features"]) if r["features"] else None,
        device=r["device"], batch_size=r["batch_size"], predicted_sps=r["predicted_sps"],
        measured_sps=r["measured_sps"], cpu_s_per_sample=r["cpu_s_per_sample"],
        bytes_per_sample=r["bytes_per_sample"],
        loading_curve=tuple((float(c), float(s)) for c, s in json.loads(r["loading_curve"])),
        exit_code=r["exit_code"], declared_samples=r["declared_samples"],
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _outcome(exit_code: int | None) -> str:
    if exit_code is None:
        return "exit status unknown (the launcher went away)"
    return "completed" if exit_code == 0 else f"failed with exit code {exit_code}"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _estimate(rows: list[sqlite3.Row]) -> HistoryEstimate:
    measured = [r["measured_sps"] for r in rows if r["measured_sps"]]
    gpus = statistics.mode(r["gpus"] for r in rows)
    curve: tuple[tuple[float, float], ...] = ()
    for r in reversed(rows):
        points = json.loads(r["loading_curve"])
        if points:
            curve = tuple((float(c), float(s)) for c, s in points)
            break
    completed = [r for r in rows if r["exit_code"] == 0]
    return HistoryEstimate(
        runs=len(rows),
        completed_runs=len(completed),
        samples=float(statistics.median(r["samples"] for r in completed)) if completed else None,
        duration_s=float(statistics.median(r["duration_s"] for r in completed)) if completed else None,
        max_throughput=statistics.median(measured) if measured else None,
        max_throughput_range=(min(measured), max(measured)) if measured else None,
        gpus=gpus,
        cpu_s_per_sample=_median([r["cpu_s_per_sample"] for r in rows]),
        bytes_per_sample=_median([r["bytes_per_sample"] for r in rows]),
        loading_curve=curve,
    )
