"""A job mix: which synthetic jobs arrive on the node, when, and how heavy each is.

The file format (``adloader bench --mix FILE``)::

    {"name": "...", "description": "...",          (optional)
     "read_bps": 200e6,                            (optional: the node's read budget)
     "gpus": 8,                                    (optional: the node's GPUs; a job that does not
                                                    fit in the free ones at its arrival_s waits,
                                                    first come first served: bench/gpu_queue.py)
     "jobs": [{"name": str, "gpus": int, "batch_size": int,
               "compute_ms_per_batch": float, "image_px": int, "samples": int,
               "arrival_s": float, "num_workers": int, "io_bound": bool,
               "model": str,                       (optional: see bench/model_jobs.py)
               "phase_after_s": float, "phase_cost": int,   (optional: loading cost x phase_cost
                                                    from phase_after_s after the job starts)
               "first_phase_cost": int,             (optional, 1: loading cost until then; above
                                                    phase_cost, a job that gets cheaper)
               "python_ms_per_batch": float,       (optional: single-threaded Python work per
                                                    batch in the training process, before the
                                                    batch is ready: a loader bound by Python)
               "eval_every_steps": int,             (optional: every this many training steps,
               "eval_batches": int,                  evaluate on eval_batches batches of a second
               "eval_compute_ms_per_batch": float}]} DataLoader, each a forward pass this long)

``num_workers`` is what the job would ask for unmanaged (the ``static`` policy
keeps it). ``image_px`` is the JPEG side length, or for an ``io_bound`` job the
side of its raw uint8 RGB samples, read from disk with O_DIRECT. A mix is
validated as a whole: every problem is reported with the job and field it is in.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from adloader.errors import AdloaderError

MIXES_DIR = Path(__file__).resolve().parent / "mixes"
DEFAULT_MIX = MIXES_DIR / "adloader_like.json"
PREDICTION_MIX = MIXES_DIR / "prediction_start.json"


class MixError(AdloaderError):
    """A mix file is missing, is not JSON, or a job in it is invalid."""


@dataclass(frozen=True)
class JobSpec:
    name: str
    gpus: int
    batch_size: int
    compute_ms_per_batch: float
    image_px: int
    samples: int
    arrival_s: float
    num_workers: int
    io_bound: bool = False
    model: str | None = None
    """A model of the throughput model's corpus (bench/model_jobs.py): the job sends its
    features at registration, as a job using ``adloader.describe_model`` would."""
    phase_after_s: float | None = None
    """The job changes phase this long after it starts: its loading cost multiplies by ``phase_cost``."""
    phase_cost: int = 1
    first_phase_cost: int = 1
    """Its loading cost multiplier before ``phase_after_s`` (a job dear first, then cheaper: an
    augmentation-heavy warm-up, then a cached or smaller-crop phase)."""
    python_ms_per_batch: float = 0.0
    """Pure-Python work per batch in the training process before the batch is ready (more
    cores or workers do not help: the loader is bound by Python)."""
    eval_every_steps: int | None = None
    """Every this many training steps the job evaluates: ``eval_batches`` batches of a second
    DataLoader (the validation set), each followed by a forward pass of
    ``eval_compute_ms_per_batch``. A forward pass is shorter than a training step, so while it
    evaluates the job wants its samples faster: a recurring phase, as real jobs have."""
    eval_batches: int | None = None
    eval_compute_ms_per_batch: float | None = None

    @property
    def evaluates(self) -> bool:
        """The job evaluates every ``eval_every_steps`` training steps."""
        return None not in (self.eval_every_steps, self.eval_batches, self.eval_compute_ms_per_batch)

    @property
    def changes_phase(self) -> bool:
        """The job's loading cost changes mid-run (``phase_after_s``, ``first_phase_cost`` ->
        ``phase_cost``)."""
        return self.phase_after_s is not None and self.phase_cost != self.first_phase_cost

    @property
    def max_throughput(self) -> float:
        """M: samples/s if data never stalled (the emulated GPU's rate)."""
        return self.batch_size / (self.compute_ms_per_batch / 1000.0)

    @property
    def raw_sample_bytes(self) -> int:
        """Bytes of one raw sample of an io-bound job: px·px·3, rounded up to O_DIRECT's 4 KiB."""
        size = self.image_px * self.image_px * 3
        return -(-size // 4096) * 4096


@dataclass(frozen=True)
class Mix:
    jobs: tuple[JobSpec, ...]
    name: str = "mix"
    description: str = ""
    read_bps: float | None = None
    gpus: int | None = None
    """The node's GPUs: jobs queue for them (bench/gpu_queue.py); None: every job starts at its arrival."""

    def scaled(self, factor: float) -> "Mix":
        """The same mix with every job's samples and arrival scaled by ``factor`` (--quick)."""
        jobs = tuple(
            JobSpec(**{**asdict(j), "samples": max(j.batch_size, int(j.samples * factor)),
                       "arrival_s": j.arrival_s * factor,
                       "phase_after_s": None if j.phase_after_s is None else j.phase_after_s * factor})
            for j in self.jobs
        )
        return Mix(jobs=jobs, name=self.name, description=self.description, read_bps=self.read_bps, gpus=self.gpus)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.read_bps is not None:
            data["read_bps"] = self.read_bps
        if self.gpus is not None:
            data["gpus"] = self.gpus
        data["jobs"] = [{k: v for k, v in asdict(j).items() if v is not None} for j in self.jobs]
        return data


_JOB_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "gpus": (int,), "batch_size": (int,), "compute_ms_per_batch": (int, float),
    "image_px": (int,), "samples": (int,), "arrival_s": (int, float), "num_workers": (int,), "io_bound": (bool,),
    "model": (str,), "phase_after_s": (int, float), "phase_cost": (int,), "python_ms_per_batch": (int, float),
    "first_phase_cost": (int,), "eval_every_steps": (int,), "eval_batches": (int,),
    "eval_compute_ms_per_batch": (int, float),
}
_JOB_RANGES: dict[str, tuple[float, float]] = {
    "gpus": (0, 64), "batch_size": (1, 4096), "compute_ms_per_batch": (0.1, 60_000), "image_px": (16, 4096),
    "samples": (1, 10**9), "arrival_s": (0, 86_400), "num_workers": (0, 64),
    "phase_after_s": (0, 86_400), "phase_cost": (1, 16), "python_ms_per_batch": (0, 60_000),
    "first_phase_cost": (1, 16), "eval_every_steps": (1, 10**9), "eval_batches": (1, 10**9),
    "eval_compute_ms_per_batch": (0.1, 60_000),
}


def load_mix(path: str | Path) -> Mix:
    """Read and validate a mix file. Raises MixError listing every problem."""
    path = Path(path)
    examples = f"the shipped mixes in {MIXES_DIR} show the format (e.g. {DEFAULT_MIX.name})"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise MixError(f"cannot read mix {path}: {exc.strerror or exc}; {examples}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MixError(f"mix {path} is not JSON ({exc}); {examples}") from None
    return mix_from_dict(data, where=str(path))


def mix_from_dict(data: Any, where: str = "mix") -> Mix:
    """Validate ``data`` (the parsed JSON of a mix file)."""
    problems: list[str] = []
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise MixError(f"{where}: expected an object with a non-empty list \"jobs\" (see bench/mix.py)")
    unknown = set(data) - {"name", "description", "read_bps", "gpus", "jobs"}
    if unknown:
        problems.append(f"unknown top-level field(s) {sorted(unknown)}")
    read_bps = data.get("read_bps")
    if read_bps is not None and (type(read_bps) not in (int, float) or not read_bps > 0):
        problems.append(f"read_bps must be a positive number of bytes/s, got {read_bps!r}")
    node_gpus = data.get("gpus")
    if node_gpus is not None and (type(node_gpus) is not int or not 1 <= node_gpus <= 1024):
        problems.append(f"gpus (the node's) must be an integer in [1, 1024], got {node_gpus!r}")
        node_gpus = None
    jobs: list[JobSpec] = []
    for index, raw in enumerate(data["jobs"]):
        label = f"jobs[{index}]" + (f" ({raw.get('name')})" if isinstance(raw, dict) and raw.get("name") else "")
        if not isinstance(raw, dict):
            problems.append(f"{label}: must be an object")
            continue
        job_problems = _job_problems(raw)
        problems.extend(f"{label}: {p}" for p in job_problems)
        if not job_problems:
            jobs.append(JobSpec(**{k: (float(v) if _JOB_TYPES[k] == (int, float) else v) for k, v in raw.items()}))
    names = [j.name for j in jobs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"job names must be unique (the oracle matches curves by name): {duplicates}")
    too_big = sorted(j.name for j in jobs if node_gpus is not None and j.gpus > node_gpus)
    if too_big:
        problems.append(f"job(s) {too_big} need more than the node's {node_gpus} GPUs and would wait forever")
    if problems:
        raise MixError(f"{where}: " + "; ".join(problems))
    return Mix(
        jobs=tuple(sorted(jobs, key=lambda j: (j.arrival_s, j.name))),
        name=str(data.get("name", "mix")),
        description=str(data.get("description", "")),
        read_bps=float(read_bps) if read_bps is not None else None,
        gpus=node_gpus,
    )


OPTIONAL = ("io_bound", "model", "phase_after_s", "phase_cost", "first_phase_cost", "python_ms_per_batch",
            "eval_every_steps", "eval_batches", "eval_compute_ms_per_batch")


def _job_problems(raw: dict[str, Any]) -> list[str]:
    problems = []
    required = {f.name for f in fields(JobSpec) if f.name not in OPTIONAL}
    missing = sorted(required - set(raw))
    if missing:
        problems.append(f"missing {missing}")
    unknown = sorted(set(raw) - set(_JOB_TYPES))
    if unknown:
        problems.append(f"unknown field(s) {unknown}")
    for key, value in raw.items():
        types = _JOB_TYPES.get(key)
        if types is None:
            continue
        if type(value) not in types:  # type(): a bool is not an int here
            problems.append(f"{key} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
            continue
        low, high = _JOB_RANGES.get(key, (-math.inf, math.inf))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not low <= value <= high:
            problems.append(f"{key}={value} is outside [{low:g}, {high:g}]")
    evaluation = [key for key in ("eval_every_steps", "eval_batches", "eval_compute_ms_per_batch") if key in raw]
    if evaluation and len(evaluation) < 3:
        problems.append(f"eval_every_steps, eval_batches and eval_compute_ms_per_batch go together, got only {evaluation}")
    if isinstance(raw.get("name"), str) and not raw["name"].replace("-", "").replace("_", "").isalnum():
        problems.append(f"name {raw['name']!r} may hold only letters, digits, '-' and '_'")
    return problems


def random_mix(seed: int, jobs: int = 4, horizon_s: float = 40.0, read_bps: float = 600e6, cores: float = 2.0) -> Mix:
    """A reproducible random mix for ``cores`` CPUs: ``jobs`` jobs arriving within the
    first third of ``horizon_s``, heterogeneous in GPUs (1, 2, 4), image size (CPU per
    sample), emulated compute and length, one of them bound by reads. Each runs for
    ``horizon_s``/3 to ``horizon_s``/2 at full speed, or less when its loading would
    need more than a fifth to a half of the node for the whole horizon (a rough cost
    model sizes it: p ≈ 0.3 ms + 27 ns·px², 0.45 ms per raw sample)."""
    rng = random.Random(seed)
    specs = []
    reader = rng.randrange(jobs)
    for i in range(jobs):
        io_bound = i == reader
        batch = rng.choice([16, 32, 64])
        compute_ms = rng.uniform(30.0, 150.0)
        px = rng.choice([384, 512]) if io_bound else rng.choice([96, 160, 224, 320, 448])
        m = batch / (compute_ms / 1000.0)
        cpu_per_sample = 0.45e-3 if io_bound else 0.3e-3 + 27e-9 * px * px
        work_budget = rng.uniform(0.2, 0.5) * cores * horizon_s / jobs * 2  # core-seconds
        samples = min(m * rng.uniform(1 / 3, 1 / 2) * horizon_s, work_budget / cpu_per_sample)
        specs.append(JobSpec(
            name=f"r{seed}-{i}{'-io' if io_bound else ''}",
            gpus=rng.choice([1, 1, 2, 4]),
            batch_size=batch,
            compute_ms_per_batch=round(compute_ms, 1),
            image_px=px,
            samples=max(batch, int(samples)),
            arrival_s=0.0 if i == 0 else round(rng.uniform(0.0, horizon_s / 3), 1),
            num_workers=rng.choice([1, 2, 4, 8]),
            io_bound=io_bound,
        ))
    return Mix(jobs=tuple(sorted(specs, key=lambda j: (j.arrival_s, j.name))), name=f"random-{seed}",
               description=f"seeded random mix {seed}", read_bps=read_bps)
