"""The reporter: one daemon thread per training process that talks to the node controller.

When the launcher set ``ADLOADER_SOCKET`` and ``ADLOADER_JOB_ID`` (see
adloader/env.py), the first DataLoader starts it. About once a second it sends
a :class:`~adloader.protocol.Report` with this rank's cumulative counters and
applies the worker count in the :class:`~adloader.protocol.Target` reply.

Several loaders in one process (train + val): the counters are the *sum* over
all of them (cumulative, so nothing is lost when one finishes), while the
worker target is applied to the *active* loader only, the one that delivered
batches most recently, which is the one the job is waiting on; ``num_workers``
and ``batch_size`` in the report are that loader's.

When the process exits normally, one last report carries the final counters, so the
controller (and the node's job history) counts every sample the job trained on,
not only those up to the last periodic report.

A missing or restarted controller never breaks training: the reporter logs
one INFO line when the controller goes away and one when it is back, retries
with a backoff of up to ``MAX_BACKOFF_S``, and the loaders keep their last
worker count meanwhile.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Mapping, Protocol

from adloader import env, paths, protocol, unmanaged
from adloader.client import ControllerClient
from adloader.errors import ControllerRefused, ControllerUnavailable

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0
FINAL_REPORT_TIMEOUT_S = 2.0
"""How long the last report at exit may hold the process up when the controller is slow."""


class Reportable(Protocol):
    """What the reporter needs from a loader (adloader.DataLoader provides it)."""

    counters: Any
    batch_size: int | None
    num_workers: int

    def running_workers(self) -> int: ...

    def loader_pids(self) -> list[int]: ...

    def set_num_workers(self, n: int) -> None: ...


class Reporter:
    """Aggregates this process's loaders and keeps the controller informed; see the module docstring."""

    def __init__(
        self,
        socket_path: str,
        job_id: str,
        rank: int = 0,
        world_size: int = 1,
        *,
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from adloader.dataloader.stats import LoaderCounters

        self.socket_path = socket_path
        self.job_id = job_id
        self.rank = rank
        self.world_size = world_size
        self.pid = os.getpid()
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._loaders: list[tuple[weakref.ref, Any]] = []  # (loader, its counters object)
        self._finished = LoaderCounters()  # counters of loaders that no longer exist
        self._seen_batches: dict[int, int] = {}
        self._active: weakref.ref | None = None
        self._client = ControllerClient(socket_path)
        self._connected: bool | None = None  # None: never tried
        self._refusals_logged: set[str] = set()
        self._asked = 0
        """The most workers a loader of this process was built with: what the job asked for."""
        self._told_fewer = False
        self._had_loader = False
        """A managed loader was added at some point: then this rank is managed, whatever fell back."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, loader: Reportable) -> None:
        with self._lock:
            self._loaders.append((weakref.ref(loader), loader.counters))
            self._had_loader = True
            self._asked = max(self._asked, loader.num_workers)
            if self._active is None:
                self._active = weakref.ref(loader)
            self._start_locked()

    def start(self) -> None:
        """Report without a managed loader yet: a rank whose loaders all run as torch's still tells
        the controller it is alive, and why it is unmanaged (see :meth:`build_report`)."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="adloader-reporter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._client.close()

    def finish(self) -> None:
        """Stop the thread and send the final counters on a fresh connection (the thread may
        be stuck on the old one). Registered to run at interpreter exit; quiet if no
        controller answers."""
        if os.getpid() != self.pid:  # a forked child inherits the registration, not the job's counters
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=FINAL_REPORT_TIMEOUT_S)
        self._client.close()
        if self._thread is None:
            return
        try:
            with ControllerClient(self.socket_path, timeout=FINAL_REPORT_TIMEOUT_S) as client:
                client.request(self.build_report())
        except (ControllerUnavailable, ControllerRefused) as exc:
            log.debug("adloader: the final report was not delivered: %s", exc)

    def build_report(self) -> protocol.Report:
        """The report for now: summed counters, the active loader's worker count and batch size,
        and the model's features until the controller has answered a report carrying them."""
        with self._lock:
            total = self._finished.copy()
            alive = []
            for ref, counters in self._loaders:
                loader = ref()
                if loader is None:
                    self._finished = self._finished + counters
                    total = total + counters
                else:
                    total = total + counters
                    alive.append((ref, loader, counters))
            self._loaders = [(ref, counters) for ref, _, counters in alive]
            active = self._pick_active(alive)
        return protocol.Report(
            job_id=self.job_id,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=max(1, (active.batch_size or 1) if active is not None else 1),
            samples=total.samples,
            batches=total.batches,
            data_wait_s=total.data_wait_s,
            compute_s=total.compute_s,
            worker_cpu_s=total.worker_cpu_s,
            read_bytes=total.read_bytes,
            worker_load_s=total.load_s,
            num_workers=active.running_workers() if active is not None else 0,
            features=None if _features_delivered.is_set() else _model_features,
            loader_pids=tuple(sorted({pid for _, loader, _ in alive for pid in loader.loader_pids()})),
            unmanaged_reason=None if self._had_loader else ("; ".join(unmanaged.unmanaged_reasons()) or None),
        )

    def _pick_active(self, alive: list[tuple[weakref.ref, Reportable, Any]]) -> Reportable | None:
        """The loader that delivered the most batches since the last report (else the previous one)."""
        progress = []
        for ref, loader, counters in alive:
            before = self._seen_batches.get(id(counters), counters.batches)
            self._seen_batches[id(counters)] = counters.batches
            progress.append((counters.batches - before, ref))
        self._seen_batches = {k: v for k, v in self._seen_batches.items() if k in {id(c) for *_, c in alive}}
        moved = max(progress, key=lambda p: p[0], default=(0, None))
        if moved[0] > 0:
            self._active = moved[1]
        active = self._active() if self._active is not None else None
        if active is None and alive:
            self._active = alive[0][0]
            active = alive[0][1]
        return active

    def report_once(self) -> protocol.Message:
        """Send one report and apply the reply. Raises ControllerUnavailable / ControllerRefused."""
        report = self.build_report()
        reply = self._client.request(report)
        if report.features is not None:
            _features_delivered.set()
        if isinstance(reply, protocol.Target) and reply.num_workers is not None:
            with self._lock:
                active = self._active() if self._active is not None else None
            if active is not None and active.num_workers != reply.num_workers:
                log.info(
                    "adloader: controller set this rank's loader workers %d -> %d", active.num_workers,
                    reply.num_workers,
                )
                active.set_num_workers(reply.num_workers)
            elif active is not None and report.num_workers != reply.num_workers:
                # Set already, but not what runs: set it again. A no-op while workers are on their
                # way; a target that missed the workers reaches them at the next report, not never.
                active.set_num_workers(reply.num_workers)
            self._say_if_fewer(reply)
        return reply

    def _say_if_fewer(self, target: protocol.Target) -> None:
        """Warn once, in the job's own output, when the controller gives this rank fewer loader
        workers than the job asked for, with the controller's reason: otherwise only the
        controller's log says so."""
        if self._told_fewer or target.num_workers is None or target.num_workers >= self._asked:
            return
        self._told_fewer = True
        log.warning("adloader: the controller gives this rank %d loader worker%s, fewer than the %d it asked for: %s",
                    target.num_workers, "" if target.num_workers == 1 else "s", self._asked,
                    target.reason or "its policy decided so")

    def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while not self._stop.is_set():
            try:
                self.report_once()
            except ControllerUnavailable as exc:
                if self._connected is not False:
                    log.info(
                        "adloader: %s (%s); loaders keep their worker count, retrying quietly",
                        "lost the controller" if self._connected else "no controller answers", exc,
                    )
                self._connected = False
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            except ControllerRefused as exc:  # it answered: connected, but it did not take the report
                if exc.code not in self._refusals_logged:
                    self._refusals_logged.add(exc.code)
                    log.warning("adloader: the controller refused this rank's report: %s", exc.message)
            except Exception:  # noqa: BLE001 - reporting must never take training down
                log.debug("adloader reporter error", exc_info=True)
            if self._connected is False:
                log.info("adloader: reconnected to the controller at %s", self.socket_path)
            self._connected = True
            backoff = FIRST_BACKOFF_S
            self._stop.wait(self._interval)


_reporter: Reporter | None = None
_reporter_lock = threading.Lock()
_model_features: dict[str, float] | None = None
_features_delivered = threading.Event()


def announce_features(features: Mapping[str, float]) -> None:
    """Send the model's features (``adloader.describe_model``) with this process's next reports,
    so the controller predicts the job's M without the launcher's ``--model-features``."""
    global _model_features
    _model_features = {name: float(value) for name, value in features.items()}
    _features_delivered.clear()


def is_managed(environ: Mapping[str, str] | None = None) -> bool:
    """True when the launcher runs this process as a managed job (both variables set)."""
    return env.job_id(environ) is not None and env.socket_override(environ) is not None


def attach(loader: Reportable, environ: Mapping[str, str] | None = None) -> Reporter | None:
    """Register a loader with this process's reporter, starting it on first use; no-op when unmanaged."""
    reporter = _process_reporter(environ)
    if reporter is not None:
        reporter.add(loader)
    return reporter


def attach_unmanaged(environ: Mapping[str, str] | None = None) -> Reporter | None:
    """Start this process's reporter for a loader that runs as torch's (adloader.unmanaged holds
    why), so the controller hears the reason instead of nothing; no-op when the job is unmanaged."""
    reporter = _process_reporter(environ)
    if reporter is not None:
        reporter.start()
    return reporter


def _process_reporter(environ: Mapping[str, str] | None) -> Reporter | None:
    """This process's reporter, created on first use in a managed job; None when unmanaged."""
    global _reporter
    if not is_managed(environ):
        return None
    with _reporter_lock:
        if _reporter is None or _reporter.pid != os.getpid():  # a forked child starts its own
            _reporter = Reporter(
                str(paths.default_socket_path(environ)), env.job_id(environ) or "", env.rank(environ),
                env.world_size(environ),
            )
            atexit.register(_reporter.finish)
        return _reporter


def current() -> Reporter | None:
    """This process's reporter, if one was started."""
    return _reporter if _reporter is not None and _reporter.pid == os.getpid() else None
