"""An emulated training job for the reliability tests and benchmark: it must keep training
whatever happens to the controller.

Run it under ``adloader run`` (``python -m reliability.job``). The training loop
gets a step's data and then "computes" by sleeping (GPU-emulated).

Two ways to get the data:
  * ``--dataloader N``: batches from ``adloader.DataLoader`` with N workers to start
    with; the loader's own reporter thread reports and applies the controller's worker
    targets (where the real loader's behaviour is under test);
  * default: a little hashing in this process, and a light reporter thread of its own
    that sends the cumulative counters about every ``--report-every`` seconds (cheap
    enough for the many short jobs of a churn on a 2-core machine, no torch import).
    A controller that is gone is retried on a fresh connection at the next report, so
    the job reconnects when it returns; the loop never waits on the socket.

It prints JSON lines of its :class:`Progress` (one when training starts, then one per
report or every ``--report-every`` seconds, a last one when it ends: ``--seconds``
passed, or SIGTERM/SIGINT, exit 0). A test reads the last line to see whether training
ever stopped (``max_step_gap_s``) and whether the reporter got through again after an
outage (``reconnects``). Unmanaged (no ADLOADER_JOB_ID) it trains and reports nothing:
run so, it is the canary that shows how long steps take on a busy machine anyway.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from adloader import env, paths, protocol
from adloader.client import ControllerClient
from adloader.errors import ControllerRefused, ControllerUnavailable

_WORK = bytes(range(256)) * 64  # 16 KiB hashed per step: the "loading" CPU work


@dataclass
class Progress:
    """What the job has done so far; one JSON line of it is printed per report attempt."""

    job_id: str | None
    steps: int = 0
    samples: int = 0
    max_step_gap_s: float = 0.0
    """Longest time between two finished steps: training stalls show up here."""
    max_step_gap_ended: float | None = None
    """Unix time the longest gap ended (to line it up with the controller's log)."""
    reports_ok: int = 0
    unavailable: int = 0
    """Report attempts that found no controller (connection refused or lost)."""
    refused: dict[str, int] = field(default_factory=dict)
    """Error replies by code: a well-behaved job should get none."""
    reconnects: int = 0
    """Reports that got through on a fresh connection after an outage."""
    target_workers: int | None = None
    last_ok_wall: float | None = None
    wall: float = 0.0


class Reporter(threading.Thread):
    """Sends the job's counters every ``interval`` seconds until ``stop`` is set."""

    def __init__(self, progress: Progress, lock: threading.Lock, interval: float, batch_size: int,
                 compute: list[float]) -> None:
        super().__init__(name="reporter", daemon=True)
        self.progress, self.lock, self.interval = progress, lock, interval
        self.batch_size, self.compute = batch_size, compute
        self.stop = threading.Event()
        self._client = ControllerClient(paths.default_socket_path(), timeout=5.0)
        self._down = False

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.report_once()
            emit(self.progress, self.lock)
        self._client.close()

    def report_once(self) -> None:
        progress = self.progress
        with self.lock:
            message = protocol.Report(
                job_id=progress.job_id or "", batch_size=self.batch_size, samples=progress.samples,
                batches=progress.steps, compute_s=self.compute[0], worker_cpu_s=time.process_time(),
                num_workers=0,  # it loads in its own process, as a DataLoader without workers says
            )
        try:
            reply = self._client.request(message)
        except ControllerUnavailable:  # the client has closed its connection; the next try opens a fresh one
            progress.unavailable += 1
            self._down = True
            return
        except ControllerRefused as exc:
            progress.refused[exc.code] = progress.refused.get(exc.code, 0) + 1
            return
        if isinstance(reply, protocol.Target):
            progress.target_workers = reply.num_workers
        progress.reports_ok += 1
        progress.reconnects += self._down
        self._down = False
        progress.last_ok_wall = time.time()


def emit(progress: Progress, lock: threading.Lock) -> None:
    with lock:
        progress.wall = time.time()
        line = json.dumps(asdict(progress))
    print(line, flush=True)


def parse_progress(text: str) -> Progress | None:
    """The last Progress line in a job's output, or None if it printed none."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return Progress(**data)
    return None


class HashingDataset:
    """A map-style dataset whose samples cost a little real CPU (hashing) to load."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        import torch

        digest = hashlib.sha256(_WORK + index.to_bytes(8, "little")).digest()
        return torch.frombuffer(bytearray(digest), dtype=torch.uint8)


def batches(batch_size: int, loader_workers: int | None, load_rounds: int = 1) -> Iterator[None]:
    """One item per training step: a batch from adloader.DataLoader (its own reporter thread
    talks to the controller and applies its worker targets), or with ``loader_workers`` None
    a step's worth of hashing in this process (``load_rounds`` times 16 KiB)."""
    if loader_workers is None:
        while True:
            for _ in range(load_rounds):
                hashlib.sha256(_WORK).digest()
            yield None
    from adloader import DataLoader

    loader = DataLoader(HashingDataset(64 * batch_size), batch_size=batch_size, num_workers=loader_workers)
    while True:
        for _ in loader:
            yield loader


def train(seconds: float, step_s: float, batch_size: int, report_every: float,
          loader_workers: int | None = None, load_rounds: int = 1) -> Progress:
    progress, lock = Progress(job_id=env.job_id()), threading.Lock()
    compute = [0.0]
    reporter = None
    if progress.job_id and loader_workers is None:
        reporter = Reporter(progress, lock, report_every, batch_size, compute)
        reporter.start()
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    emit(progress, lock)  # "training": from here on SIGTERM ends the job cleanly
    deadline = time.monotonic() + seconds
    last_step: float | None = None  # gaps count from the first step: startup (torch, workers) is not a stall
    next_emit = 0.0
    for loader in batches(batch_size, loader_workers, load_rounds):
        if stopping.is_set() or time.monotonic() >= deadline:
            break
        started = time.monotonic()
        time.sleep(step_s)  # the GPU-emulated step
        now = time.monotonic()
        with lock:
            compute[0] += now - started
            progress.steps += 1
            progress.samples += batch_size
            if last_step is not None and now - last_step > progress.max_step_gap_s:
                progress.max_step_gap_s, progress.max_step_gap_ended = now - last_step, time.time()
            if loader is not None:
                progress.target_workers = loader.num_workers
        last_step = now
        if reporter is None and now >= next_emit:  # no reporter thread of ours prints lines
            emit(progress, lock)
            next_emit = now + report_every
    if reporter is not None:
        reporter.stop.set()
        reporter.join(timeout=10)
    emit(progress, lock)
    return progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="train this long, then exit 0")
    parser.add_argument("--step-s", type=float, default=0.05, help="GPU-emulated compute time per step")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--report-every", type=float, default=0.25)
    parser.add_argument("--load-rounds", type=int, default=1, metavar="N",
                        help="without --dataloader: hash 16 KiB N times per step (the loading cost)")
    parser.add_argument("--dataloader", type=int, default=None, metavar="WORKERS",
                        help="load through adloader.DataLoader starting with WORKERS workers (its reporter reports)")
    args = parser.parse_args(argv)
    train(args.seconds, args.step_s, args.batch_size, args.report_every, args.dataloader, args.load_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
