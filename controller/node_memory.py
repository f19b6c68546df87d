"""What the node remembers of its jobs, wired into the registry's three seams.

The registry knows nothing of SQLite or of the throughput model: it is handed
a predictor ``(features, gpus) -> (M, low, high)``, a hook for finished jobs and a
lookup of a recurring job's length. This module builds those three from the job
history in the state directory (``history.sqlite``) and the throughput model, and
imports the model (and torch) only when a job first sends features.

The model is fitted on the zoo corpus shipped with adloader, profiled on one CPU. A node whose
CPU is another model predicts less well from it; ``adloader model profile --out
<state-dir>/corpus.json`` profiles this node's own, which the model is then fitted on.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from controller.history import FinishedJob, JobHistory
from controller.priors import Recollection
from controller.snapshot import JobSnapshot

if TYPE_CHECKING:
    from controller.remaining import LearntLengths

log = logging.getLogger(__name__)

HISTORY_FILE = "history.sqlite"
CORPUS_FILE = "corpus.json"
"""This node's own zoo corpus (``adloader model profile --out <state-dir>/corpus.json``), if profiled."""


@dataclass(frozen=True)
class CorpusChoice:
    """Which zoo corpus this node's CPU model is fitted on, in words, and what would make it better."""

    path: Path | None
    """``<state-dir>/corpus.json``, or None for the shipped corpus."""
    warn: bool
    says: str
    fix: str = ""


def choose_corpus(state_dir: Path, device: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> CorpusChoice:
    """The node's own corpus when it has a readable one, else the shipped one, with a warning where the
    shipped one was profiled on another CPU. A GPU node is predicted by the GPU prior and its history."""
    from throughput_model.corpus import cpu_model_name, load_corpus
    from throughput_model.errors import CorpusError

    if device.split(":")[0].lower() != "cpu":
        return CorpusChoice(None, False, f"{device}: predicted by the GPU prior, corrected by this node's history")
    own = Path(state_dir) / CORPUS_FILE
    profile = f"profile this CPU once while it is idle (10-20 min): adloader model profile --out {own}"
    if own.exists():
        try:
            profiled_on = load_corpus(own).get("cpu_model", "an unnamed CPU")
        except CorpusError as exc:
            return CorpusChoice(None, True, f"{exc}; predicting from the shipped corpus", profile)
        return CorpusChoice(own, False, f"the throughput model is fitted on this node's corpus {own} "
                                        f"(profiled on {profiled_on})")
    host, profiled_on = cpu_model_name(cpuinfo), load_corpus().get("cpu_model")
    if host != profiled_on:
        return CorpusChoice(None, True, f"the throughput model's shipped corpus was profiled on another CPU "
                                        f"({profiled_on}), not this host's ({host}): its prediction intervals are "
                                        "too narrow here until this node's history corrects them (3 finished jobs)",
                            profile)
    return CorpusChoice(None, False, f"the throughput model is fitted on the shipped corpus, profiled on this CPU "
                                     f"({host})")


def detect_device(proc: Path = Path("/proc")) -> str:
    """The node's accelerator model as the NVIDIA driver names it ("NVIDIA H100 80GB HBM3"),
    read from ``/proc/driver/nvidia/gpus/*/information``; "cpu" when there is none."""
    for info in sorted((proc / "driver" / "nvidia" / "gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model" and value.strip():
                    return value.strip()
        except OSError:
            continue
    return "cpu"


class NodeMemory:
    """The node's job history as the registry's predictor, finished-job hook and length lookup."""

    def __init__(self, state_dir: Path, device: str) -> None:
        self.device = device
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / HISTORY_FILE
        self._history: JobHistory | None = None
        self._opened = False
        self._predictor: Callable[[dict[str, float], int], tuple[float, float, float] | None] | None = None
        self._loading: threading.Thread | None = None
        self._lengths: "LearntLengths | None" = None

    @property
    def history(self) -> JobHistory | None:
        """The history, opened at first use (a controller that refuses to start touches nothing);
        None when the state directory cannot hold it."""
        if not self._opened:
            self._opened = True
            try:
                self._history = JobHistory(self.path)
            except (OSError, sqlite3.Error) as exc:  # a read-only or full state dir must not stop the node
                log.warning("job history %s is unavailable (%s): predicting from the model alone, recording "
                            "nothing; make the state directory writable to keep a history", self.path, exc)
        return self._history

    def predict(self, features: dict[str, float], gpus: int) -> tuple[float, float, float] | None:
        """M and its interval for a job with these features: its own earlier runs, else the model.

        The first call starts loading the model (torch, the device's numbers, the fit: seconds)
        on a thread and answers None, so the controller's event loop never waits for it; the
        registry asks again every control step until the answer is ready."""
        if self._predictor is None:
            if self._loading is None:
                self._loading = threading.Thread(target=self._load_predictor, name="adloader-predictor", daemon=True)
                self._loading.start()
            return None
        return self._predictor(features, gpus)

    def _load_predictor(self) -> None:
        from controller.prediction import ThroughputPredictor  # imports torch: only once a job sends features

        predictor = ThroughputPredictor(device=self.device, history=self.history, corpus=self._corpus())
        try:
            predictor({"batch_size": 1.0}, 1)  # load the corpus fit and the device numbers now
        except Exception:  # noqa: BLE001 - a warm-up failure shows again, logged, on the real call
            log.debug("throughput predictor warm-up failed", exc_info=True)
        self._predictor = predictor
        log.info("throughput predictor ready for device %s", self.device)

    def _corpus(self) -> Path | None:
        """This node's corpus, or None (the shipped one); says once which, and what to do where it helps."""
        choice = choose_corpus(self.state_dir, self.device)
        if choice.warn:
            log.warning("%s: %s", choice.says, choice.fix)
        else:
            log.info("%s", choice.says)
        return choice.path

    def record(
        self, snapshot: JobSnapshot, features: dict[str, float] | None, loading_curve: tuple[tuple[float, float], ...],
        exit_code: int | None, declared_samples: int | None = None,
    ) -> None:
        """Store a finished job with its exit status and declared length (only one that processed
        samples: an aborted start teaches nothing)."""
        history = self.history
        if history is None or snapshot.samples_total <= 0:
            return
        history.record(FinishedJob.from_snapshot(snapshot, exit_code=exit_code, features=features,
                                                 loading_curve=loading_curve, device=self.device,
                                                 declared_samples=declared_samples))

    def _learnt_length(self, history: JobHistory, name: str, features: dict[str, float] | None,
                       declared: int | None) -> float | None:
        """The length the history's forests predict for a job (a fraction of its declared length
        where it declares one; the interval's long end where uncertain: controller/remaining.py);
        None when they cannot tell. A failing fit never refuses a job."""
        from controller.remaining import LearntLengths  # scikit-learn once a length is to be learnt
        from throughput_model.lengths import ranking_length

        if self._lengths is None:
            self._lengths = LearntLengths(history)
        try:
            prediction = self._lengths.predict(name, int((features or {}).get("gpus", 1)), features,
                                               declared=declared)
        except Exception:
            log.exception("predicting the length of job %s from the history failed", name)
            return None
        length, source = ranking_length(prediction, None)
        if prediction is not None and length is not None:
            log.info("job %s: length %.0f samples learnt from the history (%s; interval %.0f-%.0f%s)", name, length,
                     source, prediction.low, prediction.high, f"; declared {declared}" if declared else "")
        return length

    def recall(self, name: str, features: dict[str, float] | None,
               declared: int | None = None) -> Recollection | None:
        """What the history says of a job: its length learnt by the forests first, else that of
        its own completed runs (same name and features), else none (the registry keeps the declared
        length); and what its own earlier runs measured. None: nothing."""
        history = self.history
        if history is None:
            return None
        estimate = history.lookup(name, features)
        learnt = self._learnt_length(history, name, features, declared)
        if estimate is None:
            return Recollection(samples=learnt) if learnt else None
        cost = estimate.cpu_s_per_sample
        if estimate.loading_curve:  # the group's CPU per sample, what the curve models: preferred
            cores, samples_per_s = estimate.loading_curve[-1]
            cost = cores / samples_per_s if samples_per_s > 0 else cost
        return Recollection(samples=learnt or estimate.samples, cpu_s_per_sample=cost,
                            bytes_per_sample=estimate.bytes_per_sample)
