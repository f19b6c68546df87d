"""What waits for this node's GPUs, read from the scheduler: ``adloader controller --pending``.

``slurm`` asks Slurm: ``squeue --noheader --states=PENDING`` for the partitions this node is
in (``sinfo``), or those named (``slurm:gpu,debug``). A pending job has no node yet; one
waiting in a partition of this node could start here. Its GPUs are read from its generic
resources per node (``--gres=gpu:4``, ``gres:gpu:a100:2``; none: 0). A path instead names a
JSON file another program keeps (``{"jobs": [{"name", "gpus", "samples"}]}``, replaced
atomically: the node benchmark's queue, bench/runner.py).

Slurm's queue is read at most every ``REFRESH_S`` (a subprocess per control step would cost
more than the step), a file at every step; a read that fails is logged once and leaves the last queue seen in
place until it has been stale ``stale_s``, then the queue is unknown (None), so ``jct``
falls back to ``adaptive`` rather than act on an old queue. Commands run through an
injectable runner; the clock is injectable.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from adloader.errors import AdloaderError
from controller.policies.pending import PendingJob

log = logging.getLogger(__name__)

REFRESH_S = 5.0
STALE_S = 30.0
COMMAND_TIMEOUT_S = 5.0
SQUEUE_FORMAT = "%i|%b|%P|%j"
"""Job id, generic resources per node, partition, name (last: a name may hold the separator)."""
_GPU_GRES = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")

Runner = Callable[[Sequence[str]], str]
"""Runs a command, returns its stdout; raises PendingQueueError when it cannot."""


class PendingQueueError(AdloaderError):
    """The scheduler's queue cannot be read (its command is missing or fails, a file is invalid)."""


def run_command(argv: Sequence[str]) -> str:
    """The default runner: the command's stdout, or PendingQueueError saying what to do."""
    if shutil.which(argv[0]) is None:
        raise PendingQueueError(f"{argv[0]} not found on PATH: install Slurm's client commands on this node, "
                                "or run the controller without --pending slurm")
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PendingQueueError(f"{' '.join(argv)} did not answer within {COMMAND_TIMEOUT_S:g}s: "
                                "is slurmctld up?") from None
    if result.returncode != 0:
        raise PendingQueueError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def gpus_of_gres(gres: str) -> int:
    """GPUs in a job's generic resources per node (``gres:gpu:4``, ``gpu:a100:2``,
    ``gres/gpu:1,gres/shard:2``); 0 for none (``N/A``, ``(null)``)."""
    return sum(int(count) for count in _GPU_GRES.findall(gres))


def parse_squeue(text: str) -> tuple[PendingJob, ...]:
    """The jobs of ``squeue --noheader --format=SQUEUE_FORMAT`` output; lines that are not
    four fields with a job id first are skipped (a warning Slurm printed in the middle)."""
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|", 3)
        if len(fields) != 4 or not fields[0].strip().split("_")[0].isdigit():
            continue
        job_id, gres, _, name = (field.strip() for field in fields)
        jobs.append(PendingJob(name=name or job_id, gpus=gpus_of_gres(gres)))
    return tuple(jobs)


class SlurmQueue:
    """Slurm's pending jobs for this node's partitions."""

    refresh_s = REFRESH_S

    def __init__(self, partitions: Sequence[str] = (), node: str | None = None, runner: Runner = run_command) -> None:
        """``partitions``: those to watch; empty: the partitions ``node`` (default: this host) is in."""
        self.partitions = tuple(partitions)
        self.node = node or socket.gethostname()
        self.runner = runner

    def read(self) -> tuple[PendingJob, ...]:
        partitions = self.partitions or self._node_partitions()
        text = self.runner(["squeue", "--noheader", "--states=PENDING", f"--partition={','.join(partitions)}",
                            f"--format={SQUEUE_FORMAT}"])
        return parse_squeue(text)

    def _node_partitions(self) -> tuple[str, ...]:
        text = self.runner(["sinfo", "--noheader", f"--nodes={self.node}", "--format=%R"])
        partitions = tuple(sorted({word.strip() for word in text.split() if word.strip()}))
        if not partitions:
            raise PendingQueueError(f"sinfo knows no partition holding node {self.node}: name the partitions to "
                                    "watch (--pending slurm:PARTITION,...), or run without --pending")
        return partitions


class FileQueue:
    """A queue kept in a JSON file by another program (the node benchmark)."""

    refresh_s = 0.0
    """A file costs little to read: every step."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> tuple[PendingJob, ...]:
        try:
            document = json.loads(self.path.read_text())
            return tuple(PendingJob(name=str(job["name"]), gpus=int(job["gpus"]),
                                    samples=float(job["samples"]) if job.get("samples") is not None else None)
                         for job in document["jobs"])
        except OSError as exc:
            raise PendingQueueError(f"cannot read the pending-queue file {self.path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise PendingQueueError(f"the pending-queue file {self.path} is not "
                                    f"{{\"jobs\": [{{\"name\", \"gpus\", \"samples\"}}]}}: {exc}") from None


Source = SlurmQueue | FileQueue


def queue_source(spec: str, runner: Runner = run_command) -> Source:
    """``--pending`` as given: ``slurm``, ``slurm:PART,PART``, or a file path."""
    if spec == "slurm" or spec.startswith("slurm:"):
        partitions = [p for p in spec.partition(":")[2].split(",") if p]
        return SlurmQueue(partitions, runner=runner)
    return FileQueue(Path(spec))


class PendingQueue:
    """The last queue read from ``source``, refreshed at most every ``refresh_s`` (default: the
    source's own)."""

    def __init__(self, source: Source, refresh_s: float | None = None, stale_s: float = STALE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.refresh_s = source.refresh_s if refresh_s is None else refresh_s
        self.stale_s = stale_s
        self._clock = clock
        self._jobs: tuple[PendingJob, ...] | None = None
        self._read_at: float | None = None
        self._tried_at: float | None = None
        self._failing = False

    def current(self) -> tuple[PendingJob, ...] | None:
        """The jobs waiting, as of the last good read; None when none succeeded within ``stale_s``."""
        now = self._clock()
        if self._tried_at is None or now - self._tried_at >= self.refresh_s:
            self._tried_at = now
            try:
                jobs = self.source.read()
                if self._jobs is None or [j.name for j in jobs] != [j.name for j in self._jobs]:
                    log.info("%d job(s) wait for this node's GPUs%s", len(jobs),
                             ": " + ", ".join(f"{j.name} ({j.gpus} GPUs)" for j in jobs) if jobs else "")
                self._jobs, self._read_at = jobs, now
                if self._failing:
                    log.info("the pending queue reads again: %d job(s) waiting", len(self._jobs))
                self._failing = False
            except PendingQueueError as exc:
                if not self._failing:
                    log.warning("cannot read the pending queue (%s); jct plans as adaptive until it reads", exc)
                self._failing = True
        if self._read_at is None or now - self._read_at > self.stale_s:
            return None
        return self._jobs
