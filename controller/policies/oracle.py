"""``oracle`` (benchmarks only): the best static allocation on the jobs' true curves.

It ignores everything measured at run time. The benchmark measures each job's curve
separately beforehand and hands them over as a JSON file named by the environment
variable ``ADLOADER_ORACLE_CURVES`` (read when the policy is built), or directly as
the constructor argument. For the live job set it searches every split of the cores
and bandwidth on a grid (an exact dynamic program over jobs, since the objective
Σ g_j·T_j/M_j is a sum over jobs) and keeps it for as long as that set lives: the
limit an allocation without measurement error or adaptation lag can reach.

Given the true curves of a job's later phases too (``phases``), it re-searches the
moment a job's age (``JobView.age_s``) enters one: the most a controller that follows
phases could get, with no measurement lag (the benchmark's ``oracle-phased`` bound).

File format::

    {"jobs": {"<job name>": {"max_throughput": 500.0,
                             "loading_curve": [[cores, samples_per_s], ...],
                             "bytes_per_sample": 0.0,
                             "phases": [{"after_s": 25.0, "max_throughput": ...,
                                         "loading_curve": ..., "bytes_per_sample": ...}]}}}

``loading_curve`` is the rate against cores *used*; it is planned with the same
margin, and turned into limits the same way, as adaptive's (controller/policies/shares.py).
``phases`` (optional): the job's true model from ``after_s`` seconds after the
controller first saw it.

Jobs the file does not name get an even share of what is left.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from controller.policies.base import READER_WORKERS_PER_CORE, Allocation, JobView, NodeResources, PolicyError
from controller.policies.shares import (
    SATISFIED,
    JobModel,
    allocations,
    contended_bandwidth,
    floors,
    spread,
    with_plan_margin,
    workers_follow_reads,
)
from throughput_model.curves import concave_lines

CURVES_VAR = "ADLOADER_ORACLE_CURVES"


LaterPhases = Mapping[str, Sequence[tuple[float, JobModel]]]
"""Job name -> (seconds after the job was first seen, its true model from then), in order."""


def _model(entry: Mapping) -> JobModel:
    """One entry of the file (a job, or one of its phases) as the model a plan uses."""
    return with_plan_margin(JobModel(
        max_throughput=float(entry["max_throughput"]),
        lines=concave_lines([(float(c), float(s)) for c, s in entry["loading_curve"]]),
        bytes_per_sample=float(entry.get("bytes_per_sample", 0.0)),
    ))


def load_true_curves(path: str | os.PathLike[str]) -> tuple[dict[str, JobModel], LaterPhases]:
    """Read the benchmark's true-curves file (format in the module docstring): each job's
    model and its later phases' models (the policy puts them in order)."""
    try:
        data = json.loads(Path(path).read_text())
        models, later = {}, {}
        for name, entry in data["jobs"].items():
            models[name] = _model(entry)
            if entry.get("phases"):
                later[name] = [(float(phase["after_s"]), _model(phase)) for phase in entry["phases"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PolicyError(
            f"cannot read the oracle's true curves from {path}: {exc}; the file is written by "
            "'adloader bench' (format in controller/policies/oracle.py)"
        ) from None
    return models, later


class OraclePolicy:
    name = "oracle"

    def __init__(
        self,
        curves: Mapping[str, JobModel] | None = None,
        later: LaterPhases | None = None,
        steps: int = 40,
        workers_per_core: float = 1.0,
        reader_workers_per_core: float = READER_WORKERS_PER_CORE,
    ) -> None:
        """``curves``: true model per job name; None reads the file named by
        ``ADLOADER_ORACLE_CURVES`` (and ``later`` with it). ``later``: the true models of
        jobs' later phases (none: the first holds throughout). ``steps``: grid points per
        resource."""
        if curves is None:
            path = os.environ.get(CURVES_VAR)
            if not path:
                raise PolicyError(
                    f"the oracle policy needs the jobs' true curves: set {CURVES_VAR} to a JSON file "
                    "(adloader bench writes one); it is meant for benchmarks only"
                )
            curves, later = load_true_curves(path)
        self.curves = dict(curves)
        self.later = {name: tuple(sorted(phases, key=lambda phase: phase[0])) for name, phases in (later or {}).items()}
        self.steps = steps
        self.workers_per_core = workers_per_core
        self.reader_workers_per_core = reader_workers_per_core
        self._memo: dict[tuple, Allocation] = {}

    def allocate(self, node: NodeResources, jobs: Sequence[JobView]) -> Allocation:
        """The best static split for this job set and the phases its jobs are in; the search
        runs once per such set (the answer depends on nothing a job reports), so the
        controller's loop stays cheap."""
        if not jobs:
            return {}
        jobs = sorted(jobs, key=lambda j: j.job_id)
        phases = {job.job_id: self._phase(job) for job in jobs}
        key = (node, tuple((job.job_id, job.name, job.gpus, job.ranks, phases[job.job_id]) for job in jobs))
        if key not in self._memo:
            if len(self._memo) > 256:
                self._memo.clear()
            self._memo[key] = self._search(node, jobs, phases)
        return self._memo[key]

    def _phase(self, job: JobView) -> int:
        """The job's phase: 0 until its age reaches the first of its later phases (a job of
        unknown age stays in its first)."""
        if job.age_s is None:
            return 0
        return sum(1 for after_s, _ in self.later.get(job.name, ()) if job.age_s >= after_s)

    def _true_model(self, job: JobView, phase: int) -> JobModel:
        return self.curves[job.name] if phase == 0 else self.later[job.name][phase - 1][1]

    def _search(self, node: NodeResources, jobs: Sequence[JobView], phases: Mapping[str, int]) -> Allocation:
        known = [job for job in jobs if job.name in self.curves]
        unknown = [job for job in jobs if job.name not in self.curves]
        truth = {job.job_id: self._true_model(job, phases[job.job_id]) for job in known}
        bandwidth = contended_bandwidth(node, jobs, truth)
        core_floor, io_floor = floors(node, len(jobs))
        cores = {job.job_id: node.cores / len(jobs) for job in unknown}
        io = {job.job_id: (bandwidth or 0.0) / len(jobs) for job in unknown}
        models = [truth[job.job_id] for job in known]
        weights = [float(max(1, job.gpus)) for job in known]
        spare_cores = node.cores - sum(cores.values()) - core_floor * len(known)
        spare_io = None
        if bandwidth is not None and any(m.bytes_per_sample > 0 for m in models):
            spare_io = bandwidth - sum(io.values()) - io_floor * len(known)
        best_cores, best_io = _best_static_split(
            models, weights, core_floor, io_floor, spare_cores, spare_io, self.steps
        )
        satisfied = set()
        for job, c, b in zip(known, best_cores, best_io):
            cores[job.job_id] = c
            io[job.job_id] = b
            if truth[job.job_id].busy(c, b if spare_io is not None else None) >= SATISFIED:
                satisfied.add(job.job_id)
        read_bps = spread(bandwidth, io, floor=io_floor) if bandwidth is not None else None
        readers = workers_follow_reads(node, truth)
        return allocations(
            node, jobs, cores, read_bps, frozenset(satisfied), readers,
            self.workers_per_core, self.reader_workers_per_core,
        )


def _best_static_split(
    models: Sequence[JobModel],
    weights: Sequence[float],
    core_floor: float,
    io_floor: float,
    spare_cores: float,
    spare_io: float | None,
    steps: int,
) -> tuple[list[float], list[float]]:
    """Exhaustive search on a grid: each job gets its floors plus u·Δc cores and v·Δb
    bytes/s, Σu ≤ steps, Σv ≤ steps, maximising Σ w_j·busy_j (``spare_io`` None: bandwidth
    is not searched). Exact on the grid by dynamic programming over jobs; ties go to the
    smaller allocation."""
    n = len(models)
    if n == 0:
        return [], []
    dc = max(0.0, spare_cores) / steps
    io_steps = steps if spare_io is not None else 0
    db = max(0.0, spare_io or 0.0) / steps if io_steps else 0.0
    grid_u = np.arange(steps + 1)
    grid_v = np.arange(io_steps + 1)
    # value[j][u, v]: weighted busy of job j with floor + u·dc cores and v·db bandwidth
    values = []
    for model, weight in zip(models, weights):
        table = np.empty((steps + 1, io_steps + 1))
        for u in grid_u:
            for v in grid_v:
                table[u, v] = weight * model.busy(core_floor + u * dc, io_floor + v * db if io_steps else None)
        values.append(table)
    # best[u, v]: best total of the jobs so far using exactly ≤ u and ≤ v units; choice[j] remembers the split
    best = np.zeros((steps + 1, io_steps + 1))
    choices = []
    for table in values:
        new = np.full_like(best, -np.inf)
        pick = np.zeros(best.shape + (2,), dtype=int)
        for u in grid_u:
            for v in grid_v:
                # job takes (a, b) units, the jobs before take (u - a, v - b)
                candidate = table[: u + 1, : v + 1] + best[u::-1, v::-1]
                flat = int(np.argmax(candidate))  # first maximum: smallest a, then smallest b
                a, b = np.unravel_index(flat, candidate.shape)
                new[u, v] = candidate[a, b]
                pick[u, v] = (a, b)
        best = new
        choices.append(pick)
    u, v = steps, io_steps
    split: list[tuple[int, int]] = []
    for pick in reversed(choices):
        a, b = pick[u, v]
        split.append((int(a), int(b)))
        u, v = u - a, v - b
    split.reverse()
    return [core_floor + a * dc for a, _ in split], [io_floor + b * db for _, b in split]
