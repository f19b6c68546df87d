"""The allocation linear program of DESIGN.md, solved by scipy's HiGHS.

For each job j with GPU weight w_j, max throughput M_j, a concave loading curve
given as lines (T_load(c) ≤ a_k + s_k·c for every k) and b_j bytes read per sample:

    maximise   Σ_j w_j·Σ_s v_s·u_js  + δ·(Σ_j w_j)·z   (busy fraction, fairness)
               + δ·Σ_g (Σ_{j∈g} w_j)·z_g             (equals equally busy)
               − ε_c·Σ_j c_j − ε_io·Σ_j io_j/B         (use no more than needed)
    subject to M_j·t_j ≤ a_k + s_k·c_j                  for every line k of job j
               M_j·b_j·t_j ≤ io_j                       when read bandwidth is managed
               Σ c_j ≤ C,  Σ io_j ≤ B,  Σ_s u_js ≤ t_j
               z ≤ t_j,  0 ≤ t_j ≤ 1,  0 ≤ u_js ≤ 1/S,  floor_j ≤ c_j ≤ cap_j,  io_floor_j ≤ io_j
               z_g ≤ t_j                                for every job j of a group g of equals

(bandwidth enters the program as fractions of B, so every variable is of order one
and the ε terms stay above the solver's tolerances; each curve line is divided by M_j,
so every row is too: with rows in samples/s, HiGHS's presolve called a program with one
job of M 2400/s and a curve of 1e-5 samples/s at 7 cores infeasible, though all jobs idle
at their floors always fit, found by tests/test_policies_properties.py).

t_j is the job's predicted busy fraction T_j/M_j. Its value is counted in S slices
u_js worth v_s = 1 down to 1 − DIMINISHING: the last slice of a job's busy time is
worth a little less than the first slice of another's. Between jobs worth the same
per core, up to measurement noise, the program then shares instead of handing
everything to whichever measured a few percent better this period (so the answer
does not flip between periods); jobs clearly worth more are still served first. The
max-min term z breaks the remaining ties; the ε terms leave cores nobody needs
unallocated, for the caller to hand out as headroom.

z lifts only the least busy job, so it leaves a tie between two equals above it open: within
one value slice any split of the cores between them is optimal, and HiGHS returns a vertex.
Two 2-GPU jobs needing 0.68 cores each, beside a job at a quarter of their weight, on 1.3
cores: busy 1.0 and 0.84, not 0.92 and 0.92; the caller then gave the first its satisfied CPU
weight (~1070) and the second one as small as its cores (~55), and on the real node one of
two equal jobs held that until it finished (bench/mixes/real_node.json, 2026-11-25). So the
caller names its groups of equals (``equals``, jobs it planned as worth the same per core) and
each group gets a max-min term z_g of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from controller.policies.base import PolicyError

Line = tuple[float, float]

TIE_BREAK = 1e-3
CORE_COST = 1e-6
IO_COST = 1e-6
SLICES = 4
DIMINISHING = 0.25
SLICE_VALUES = 1.0 - DIMINISHING * np.arange(SLICES) / (SLICES - 1)
WEIGHT_RANGE = 1e6
"""A weight more than this many times below the largest counts as that far below. Weights
that far down are of the order of the program's ε terms, so they decide little, and HiGHS
failed (status Unknown, or infeasible) on programs whose weights spanned 8^15, ``jct``'s
ranks on 28 jobs (found by tests/test_policies_properties.py)."""


@dataclass(frozen=True)
class JobDemand:
    """What the program knows about one job."""

    job_id: str
    weight: float
    """Objective weight of the job's busy fraction (its GPUs, or GPUs / remaining time)."""
    max_throughput: float
    """M: samples/s with data never stalling."""
    lines: tuple[Line, ...]
    """Loading curve: samples/s ≤ intercept + slope·cores for every line. Empty: cores never bind."""
    bytes_per_sample: float = 0.0
    """b: bytes read from the managed device per sample (0: reads hit the page cache)."""
    min_cores: float = 0.0
    max_cores: float = math.inf
    min_read_bps: float = 0.0


@dataclass(frozen=True)
class Solution:
    cores: dict[str, float]
    """Cores each job needs for its predicted busy fraction (no headroom yet)."""
    read_bps: dict[str, float]
    """Read bandwidth each job needs; empty when bandwidth is not managed."""
    busy: dict[str, float]
    """Predicted busy fraction t_j."""
    objective: float
    """Σ w_j·t_j."""


def solve(demands: Sequence[JobDemand], cores: float, read_bps: float | None,
          equals: Sequence[Sequence[str]] = ()) -> Solution:
    """Solve the program for ``demands`` on ``cores`` CPUs and ``read_bps`` bytes/s (None:
    bandwidth not managed); each group of job ids in ``equals`` is kept equally busy where the
    program is otherwise indifferent (the module docstring). Raises PolicyError if the floors
    alone exceed the cores."""
    if not demands:
        return Solution({}, {}, {}, 0.0)
    floors = sum(d.min_cores for d in demands)
    if floors > cores + 1e-9:
        raise PolicyError(
            f"{len(demands)} jobs with their core floors need {floors:.2f} cores but the node manages "
            f"{cores:.2f}: lower the per-job floor or give the controller more CPUs (--cpus)"
        )
    io_floors = sum(d.min_read_bps for d in demands)
    if read_bps is not None and io_floors > read_bps * (1 + 1e-9):
        raise PolicyError(
            f"{len(demands)} jobs with their bandwidth floors need {io_floors:.0f} B/s but the node "
            f"shares {read_bps:.0f}: raise --read-bps or lower the floor"
        )
    n = len(demands)
    io = read_bps is not None
    index = {d.job_id: j for j, d in enumerate(demands)}
    groups = [members for group in equals if len(members := [index[job] for job in group if job in index]) > 1]
    # variable layout: c_0..c_{n-1}, t_0..t_{n-1}, [io_0..io_{n-1}], u_{0,0}..u_{n-1,S-1}, z, z_g...
    C, T, IO = 0, n, 2 * n
    U = 3 * n if io else 2 * n
    Z = U + n * SLICES
    n_vars = Z + 1 + len(groups)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    rhs: list[np.ndarray] = []
    row = 0

    def block(r: np.ndarray, c: np.ndarray, v: np.ndarray, b: np.ndarray) -> None:
        nonlocal row
        rows.append(r + row)
        cols.append(c)
        vals.append(v)
        rhs.append(b)
        row += len(b)

    # curve lines over M: t_j - (s_k/M_j) c_j <= a_k/M_j (rows of order one, as the variables)
    line_job = np.array([j for j, d in enumerate(demands) for _ in d.lines], dtype=int)
    if len(line_job):
        m = np.array([demands[j].max_throughput for j in line_job])
        intercepts = np.array([a for d in demands for a, _ in d.lines]) / m
        slopes = np.array([s for d in demands for _, s in d.lines]) / m
        k = np.arange(len(line_job))
        block(
            np.concatenate([k, k]),
            np.concatenate([T + line_job, C + line_job]),
            np.concatenate([np.ones(len(line_job)), -slopes]),
            intercepts,
        )
    if io:
        scale = max(float(read_bps), 1.0)  # io variables are fractions of B
        need = np.array([d.max_throughput * d.bytes_per_sample for d in demands]) / scale
        readers = np.flatnonzero(need > 0)
        k = np.arange(len(readers))
        block(np.concatenate([k, k]), np.concatenate([T + readers, IO + readers]),
              np.concatenate([need[readers], -np.ones(len(readers))]), np.zeros(len(readers)))
        block(np.zeros(n, dtype=int), IO + np.arange(n), np.ones(n), np.array([float(read_bps) / scale]))
    block(np.zeros(n, dtype=int), C + np.arange(n), np.ones(n), np.array([float(cores)]))
    k = np.arange(n)  # z - t_j <= 0
    block(np.concatenate([k, k]), np.concatenate([np.full(n, Z), T + k]),
          np.concatenate([np.ones(n), -np.ones(n)]), np.zeros(n))
    slice_job = np.repeat(k, SLICES)  # Σ_s u_js - t_j <= 0
    block(np.concatenate([slice_job, k]), np.concatenate([U + np.arange(n * SLICES), T + k]),
          np.concatenate([np.ones(n * SLICES), -np.ones(n)]), np.zeros(n))
    if groups:  # z_g - t_j <= 0 for every job of group g
        member = np.array([j for group in groups for j in group], dtype=int)
        group_var = Z + 1 + np.repeat(np.arange(len(groups)), [len(group) for group in groups])
        k = np.arange(len(member))
        block(np.concatenate([k, k]), np.concatenate([group_var, T + member]),
              np.concatenate([np.ones(len(member)), -np.ones(len(member))]), np.zeros(len(member)))

    matrix = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, n_vars)
    ).tocsr()
    weights = np.array([d.weight for d in demands], dtype=float)
    weights = np.maximum(weights, weights.max() / WEIGHT_RANGE)
    cost = np.zeros(n_vars)
    cost[C:C + n] = CORE_COST
    cost[U:Z] = -np.repeat(weights, SLICES) * np.tile(SLICE_VALUES, n)
    if io:
        cost[IO:IO + n] = IO_COST
    cost[Z] = -TIE_BREAK * float(weights.sum())
    cost[Z + 1:] = [-TIE_BREAK * float(weights[group].sum()) for group in groups]
    bounds = [(d.min_cores, min(d.max_cores, cores)) for d in demands]
    bounds += [(0.0, 1.0)] * n
    if io:
        bounds += [(min(d.min_read_bps / scale, 1.0), 1.0) for d in demands]
    bounds += [(0.0, 1.0 / SLICES)] * (n * SLICES)
    bounds += [(0.0, 1.0)] * (1 + len(groups))
    result = linprog(cost, A_ub=matrix, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    if result.status != 0:
        raise PolicyError(f"allocation program failed ({result.message}); inputs: {len(demands)} jobs, "
                          f"{cores} cores, read_bps={read_bps}")
    x = result.x
    ids = [d.job_id for d in demands]
    busy = {job: float(min(1.0, max(0.0, x[T + j]))) for j, job in enumerate(ids)}
    return Solution(
        cores={job: float(max(demands[j].min_cores, x[C + j])) for j, job in enumerate(ids)},
        read_bps={job: float(max(demands[j].min_read_bps, x[IO + j] * scale)) for j, job in enumerate(ids)}
        if io else {},
        busy=busy,
        objective=float(sum(d.weight * busy[d.job_id] for d in demands)),
    )
