"""``python -m bench.simulate``: the policies at 8-GPU scale, simulated (bench/sim_node.py).

Two parts, both pure CPU, faster than real time, every figure SIMULATED:

1. Scale: 64- and 128-core nodes with 8 GPUs and 4, 8 or 16 jobs (16 jobs: two per
   GPU), seeded random mixes. Each job's loading cost comes from the costs measured on
   this machine (JPEG decode + augment, 0.6 to 3.4 ms of CPU per sample by image side,
   raw O_DIRECT reads 0.45 ms), its M is drawn so that the node's cores are 0.6x to 1.6x
   oversubscribed at full speed, users' num_workers are 2 to 16 per GPU; every mix has a
   job whose loading cost doubles half-way (a phase change) and a Python-bound loader
   (it never delivers more than 60% of its M, whatever its cores); half the jobs arrive
   over the first two minutes. Reported per policy (static, even, adaptive, oracle, and
   oracle_phased: the oracle re-searched on the true curves whenever a job changes phase, the
   bound for a controller that follows phases):
   GPU-weighted busy fraction, slowest settle after an arrival or departure and, apart, after a
   phase change (the node benchmark's ``settle_s`` and ``phase_settle_s``), allocation
   changes per job-minute, decision time per step, safety-net reverts. ``oracle`` is the
   better of the static splits best for the jobs' first and for their last phases.
   Crossing phases (``crossing_mix``): oversubscribed mixes in which every job changes phase,
   half of them dearer and half cheaper, where a split cannot serve both phases; static,
   adaptive, oracle and oracle_phased. Crossing pairs (``crossing_pair``): two jobs on the
   measured 2-core node whose phases cross, both CPU-bound in both phases, where following
   the phases is worth most.
2. Check against reality: the shipped 2-core mixes (bench/results/node.json, and
   node_real.json: a phase change, Python work in a training loop, more jobs than cores) and
   the seeded random mixes (bench/results/node_random.json) replayed in the model with what
   their runs measured (bench/replay.py: each job's CPU per sample, the disk's curve, start-up
   time, the quota response and the fetch time no prefetching hides); the simulated ratios
   adaptive/static and adaptive/even against the measured ones, and by how much they differ.

Model constants not measurable on two cores (parallel-efficiency loss per core at 64
cores) are assumptions, named in sim_node.SimJob.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bench import machine
from bench.replay import (
    DISK_BPS,
    MEASURED_COST_S,
    STARTUP_S,
    abs_differences_pct,
    jobs_from_measured_mix,
    measured_documents,
    measured_node,
    reality_check,
)
from bench.mix import Mix, load_mix
from bench.report import write_json
from bench.sim_node import SimJob, SimNode, SimResult, simulate
from controller.policies import AdaptiveRules, PolicyError, make_policy
from controller.policies.base import Policy
from controller.policies.oracle import OraclePolicy
from controller.policies.rules import parse_without
from controller.policies.shares import JobModel, with_plan_margin
from throughput_model.curves import concave_lines

POLICIES = ("static", "even", "adaptive", "oracle", "oracle_phased")
CROSSING_POLICIES = ("static", "adaptive", "oracle", "oracle_phased")


# ---------------------------------------------------------------------------------------- mixes

def _sized_jobs(rng: random.Random, cores: int, per_job: Sequence[int], load_range: tuple[float, float],
                durations_s: tuple[float, float] = (180.0, 600.0)) -> Iterator[tuple[int, int, float, float, float]]:
    """(index, GPUs, CPU s per sample, M, seconds at full speed) of each job of a mix whose
    jobs, of ``per_job`` GPUs each, at full speed want ``load_range`` times the node's cores,
    split at random; lazily, so the caller's own draws for a job come between this one's, in a
    fixed order (seeded mixes)."""
    load = rng.uniform(*load_range) * cores
    shares = [rng.expovariate(1.0) * g for g in per_job]
    for i, (g, share) in enumerate(zip(per_job, shares)):
        p = MEASURED_COST_S[rng.choice(sorted(MEASURED_COST_S))]
        m = max(20.0 * g, load * share / sum(shares) / p)
        yield i, g, p, m, rng.uniform(*durations_s)


def scale_mix(cores: int, n_jobs: int, seed: int, gpus: int = 8) -> list[SimJob]:
    """A seeded random mix for a node of ``cores`` cores and ``gpus`` GPUs (see the module docstring)."""
    rng = random.Random(seed * 1000 + cores + n_jobs)
    return [SimJob(
        name=f"s{cores}-{n_jobs}-{seed}-{i}", gpus=g, max_throughput=m, cpu_s_per_sample=p,
        samples=m * duration, arrival_s=0.0 if i < n_jobs // 2 else rng.uniform(0.0, 120.0),
        requested_workers=rng.choice([2, 4, 8, 16]), ranks=g, batch_size=rng.choice([32, 64, 128]),
        phases=((duration / 2, 2.0),) if i == 0 else (),
        python_cap=0.6 * m if i == 1 else math.inf, startup_s=STARTUP_S,
    ) for i, g, p, m, duration in _sized_jobs(rng, cores, [max(1, gpus // n_jobs)] * n_jobs, (0.6, 1.6))]


CROSSING_FACTORS = (2.5, 0.4)
"""Loading-cost multipliers of a crossing mix's jobs from their phase change on: alternately
dearer (augmentation switched on) and cheaper (a cached or smaller-crop phase)."""


def crossing_mix(cores: int, n_jobs: int, seed: int, gpus: int = 8) -> list[SimJob]:
    """A seeded mix in which following phases should be worth something: the node is
    oversubscribed (1.0x to 1.6x its cores at full speed), every job changes phase between 30%
    and 60% of its run, alternately dearer and cheaper, so the split best for the first phase
    starves the jobs that became dearer (too few workers, too small a weight) while those that
    became cheaper hold what they no longer use. The mixes of ``scale_mix`` have one job of
    4-16 doubling its cost, which the static oracle's work-conserving weights already cover."""
    rng = random.Random(seed * 7919 + cores + n_jobs)
    return [SimJob(
        name=f"x{cores}-{n_jobs}-{seed}-{i}", gpus=g, max_throughput=m, cpu_s_per_sample=p,
        samples=m * duration, requested_workers=rng.choice([2, 4, 8, 16]), ranks=g,
        batch_size=rng.choice([32, 64, 128]),
        phases=((duration * rng.uniform(0.3, 0.6), CROSSING_FACTORS[i % 2]),), startup_s=STARTUP_S,
    ) for i, g, p, m, duration in _sized_jobs(rng, cores, [max(1, gpus // n_jobs)] * n_jobs, (1.0, 1.6))]


PHASE_COSTS = (2, 3, 4)
"""How many times dearer a job of a 2-core phase mix gets (``adloader bench``'s phase_cost: each
sample loaded that many times)."""


def two_core_phase_mix(cores: int, n_jobs: int, seed: int) -> list[SimJob]:
    """A seeded mix for the measured 2-core node (``measured_node``), as ``adloader bench``
    could run it: 1-4 GPUs a job, one process each, 50-90 s at full speed, the node 1.0x to
    2.0x oversubscribed, and one or two jobs getting 2-4x dearer from 30-60% of their run (the
    only way the benchmark's jobs change phase). Following phases was measured at this size
    (``real_node.json``); this asks how much it could give here."""
    rng = random.Random(seed * 104_729 + cores + n_jobs)
    gpus = [rng.choice([1, 2, 4]) for _ in range(n_jobs)]
    dearer = set(rng.sample(range(n_jobs), rng.choice([1, 2]) if n_jobs > 1 else 1))
    return [SimJob(
        name=f"p{cores}-{n_jobs}-{seed}-{i}", gpus=g, max_throughput=m, cpu_s_per_sample=p, samples=m * duration,
        requested_workers=rng.choice([2, 4, 8]), batch_size=32, startup_s=STARTUP_S,
        phases=((duration * rng.uniform(0.3, 0.6), float(rng.choice(PHASE_COSTS))),) if i in dearer else (),
    ) for i, g, p, m, duration in _sized_jobs(rng, cores, gpus, (1.0, 2.0), durations_s=(50.0, 90.0))]


CROSSING_PAIRS = ((1.2, 2.5), (1.0, 3.0), (1.5, 2.0), (0.9, 4.0))
"""(cores a job's cheap phase needs at full speed, how many times dearer its other phase is)
of the crossing pairs (``crossing_pair``)."""
PAIR_CHEAP_S_PER_SAMPLE = 0.0025
"""CPU seconds a crossing pair's cheap sample costs (a 160 px JPEG on the measured node)."""


def crossing_pair(need_cores: float, factor: float, duration_s: float = 80.0) -> list[SimJob]:
    """Two 1-GPU jobs for the measured 2-core node whose phases cross half-way through their
    runs: one cheap then ``factor`` times dearer, the other the reverse, the same M; in its
    cheap phase a job needs ``need_cores`` at full speed. Both are CPU-bound in both phases and
    the job worth more per core swaps at the change, so no static split serves both halves:
    the case where following phases pays most. The seeded crossing mixes, whose jobs change
    at different times and are often fed in one phase, gain little from it."""
    m = need_cores / PAIR_CHEAP_S_PER_SAMPLE
    change_s = duration_s / 2
    first, second = (PAIR_CHEAP_S_PER_SAMPLE, factor), (PAIR_CHEAP_S_PER_SAMPLE * factor, 1.0 / factor)
    return [SimJob(name=f"pair-{need_cores:g}-{factor:g}-{name}", gpus=1, max_throughput=m, cpu_s_per_sample=cost,
                   samples=m * duration_s, requested_workers=4, startup_s=STARTUP_S, phases=((change_s, then),))
            for name, (cost, then) in (("cheap-first", first), ("dear-first", second))]


def true_model(job: SimJob, age_s: float, node: SimNode) -> JobModel:
    """The job's true model at ``age_s`` after its arrival on ``node``, planned as the oracle
    plans: its M is what it reaches with a worker per core when its loader keeps up."""
    points = [(c, job.loading_rate(c, age_s)) for c in (0.5, 1, 2, 4, 8, 16, 32, 64, 128)]
    full_speed = node.fetch_ceiling(job.max_throughput, job.ranks, workers_per_core=1.0)
    return with_plan_margin(JobModel(max_throughput=full_speed, lines=concave_lines(points),
                                     bytes_per_sample=job.bytes_per_sample))


def oracle_for(jobs: Sequence[SimJob], node: SimNode, last_phase: bool = False,
               follow_phases: bool = False) -> OraclePolicy:
    """The oracle on the jobs' true curves of their first phase, or of their last one; or,
    ``follow_phases``, re-searched the moment any job enters a new phase, on the true curves
    of that phase: the most a controller that follows phases could get over ``oracle``, with
    no measurement lag (a bound, for the report). A job's phases count from its arrival and
    its age from its first report (``startup_s`` later), so each is told ``startup_s`` early."""
    last_start = {job.name: max((start for start, _ in job.phases), default=0.0) for job in jobs}
    later = {job.name: [(start - job.startup_s, true_model(job, start, node)) for start, _ in job.phases]
             for job in jobs if follow_phases and job.phases}
    return OraclePolicy(curves={job.name: true_model(job, last_start[job.name] if last_phase else 0.0, node)
                                for job in jobs}, later=later)


def run_policy(name: str, node: SimNode, jobs: Sequence[SimJob], seed: int,
               rules: AdaptiveRules = AdaptiveRules()) -> SimResult:
    """One simulated run. ``oracle`` is the best static split: the better of the splits best
    for the jobs' first phases and for their last phases (a split cannot follow a phase, but
    the bound may know which phase matters more). ``rules``: adaptive's rules on (an ablation)."""
    if name == "oracle":
        runs = [simulate(node, jobs, oracle_for(jobs, node, last_phase=last), seed=seed)
                for last in ((False, True) if any(job.phases for job in jobs) else (False,))]
        return max(runs, key=lambda run: run.gpu_busy)
    policy: Policy = oracle_for(jobs, node, follow_phases=True) if name == "oracle_phased" \
        else make_policy(name, rules)
    # the bound knows the truth: nothing for the safety net to catch, and its own cuts, which
    # make the cut jobs slower by design, are not to be taken back
    return simulate(node, jobs, policy, seed=seed, safety_net=rules.safety_net and name != "oracle_phased")


# ---------------------------------------------------------------------------------------- scoring

def settle_times(result: SimResult, after_phases: bool = False) -> list[float]:
    """For each arrival or departure (``after_phases``: each phase change instead): seconds until
    the last change of any job's quota, weight or workers before the next event (bench/report.py's
    rule, on the simulated steps: ``settle_s`` and ``phase_settle_s`` of the node benchmark)."""
    steps = result.steps
    times = []
    for n, event in enumerate(result.events):
        if (event in result.phase_events) != after_phases:
            continue
        end = result.events[n + 1] if n + 1 < len(result.events) else math.inf
        window = [s for s in steps if event <= s.t < end]
        last = event
        for before, after in zip(window, window[1:]):
            common = set(before.allocations) & set(after.allocations)
            if any(before.allocations[j] != after.allocations[j] for j in common):
                last = after.t
        times.append(last - event)
    return times


def changes_per_job_minute(result: SimResult) -> float:
    changes = 0
    job_seconds = 0.0
    for before, after in zip(result.steps, result.steps[1:]):
        common = set(before.allocations) & set(after.allocations)
        job_seconds += (after.t - before.t) * len(common)
        changes += sum(1 for j in common if before.allocations[j] != after.allocations[j]
                       and any(v is not None for v in before.allocations[j]))
    return 60.0 * changes / job_seconds if job_seconds else 0.0


def score(result: SimResult) -> dict[str, Any]:
    settle, phase_settle = settle_times(result), settle_times(result, after_phases=True)
    return {
        "gpu_busy": result.gpu_busy,
        "settle_s_max": max(settle, default=0.0),
        "settle_s_median": statistics.median(settle) if settle else 0.0,
        "phase_settle_s_max": max(phase_settle, default=None),
        "changes_per_job_minute": changes_per_job_minute(result),
        "decision_ms_mean": 1000 * statistics.fmean(result.decision_s) if result.decision_s else 0.0,
        "decision_ms_max": 1000 * max(result.decision_s, default=0.0),
        "safety_net_reverts": result.reverts,
        "mean_jct_s": statistics.fmean(j["jct_s"] for j in result.jobs.values()),
    }


def run_mix(node: SimNode, jobs: Sequence[SimJob], seed: int, policies: Sequence[str] = POLICIES,
            rules: AdaptiveRules = AdaptiveRules()) -> dict[str, Any]:
    scores = {name: score(run_policy(name, node, jobs, seed, rules)) for name in policies}
    ratios = {}
    if "oracle" in scores and "oracle_phased" in scores and scores["oracle"]["gpu_busy"] > 0:
        ratios["oracle_phased_vs_oracle"] = scores["oracle_phased"]["gpu_busy"] / scores["oracle"]["gpu_busy"]
    for base in ("static", "even", "oracle", "oracle_phased"):
        if base in scores and "adaptive" in scores and scores[base]["gpu_busy"] > 0:
            ratios[f"adaptive_vs_{base}"] = scores["adaptive"]["gpu_busy"] / scores[base]["gpu_busy"]
    return {"policies": scores, "ratios": ratios}


def node_row(node: SimNode, n_jobs: int, n_mixes: int, make_mix: Callable[[int, int, int], list[SimJob]],
             policies: Sequence[str], gpus: int | None = 8, rules: AdaptiveRules = AdaptiveRules()) -> dict[str, Any]:
    """One row of a report: ``n_mixes`` seeded mixes of ``n_jobs`` jobs on ``node`` under
    ``policies``, with each policy's median GPU busy and adaptive's ratios (min, median, max)."""
    mixes = [run_mix(node, make_mix(node.cores, n_jobs, seed), seed, policies, rules)
             for seed in range(1, n_mixes + 1)]
    ratios = {k: [m["ratios"][k] for m in mixes] for k in mixes[0]["ratios"]}
    return {"cores": node.cores, "gpus": gpus, "jobs": n_jobs, "mixes": mixes,
            "gpu_busy_median": {p: statistics.median(m["policies"][p]["gpu_busy"] for m in mixes) for p in policies},
            "adaptive_ratio_min": {k: min(v) for k, v in ratios.items()},
            "adaptive_ratio_max": {k: max(v) for k, v in ratios.items()},
            "adaptive_ratio_median": {k: statistics.median(v) for k, v in ratios.items()}}


def slowest_settles(mixes: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """adaptive's slowest settle over ``mixes`` after an arrival or departure, and after a phase
    change (0 when none changed phase)."""
    adaptive = [m["policies"]["adaptive"] for m in mixes]
    return (max(a["settle_s_max"] for a in adaptive),
            max((a["phase_settle_s_max"] or 0.0 for a in adaptive), default=0.0))


# ---------------------------------------------------------------------------------------- reality check

# ---------------------------------------------------------------------------------------- shipped mix files

def mix_figures(mix: Mix, policies: Sequence[str], seeds: int = 3, rules: AdaptiveRules = AdaptiveRules()
                ) -> dict[str, Any]:
    """``mix`` (a shipped file: a queue where it gives the node's ``gpus``) on the measured 2-core
    node, each policy ``seeds`` times: medians of mean JCT (wait included), GPU busy and
    makespan, and each policy's ratios to ``adaptive``'s. SIMULATED."""
    jobs, node = jobs_from_measured_mix({"mix": mix.to_dict()})
    node = dataclasses.replace(node, gpus=mix.gpus)
    figures = {}
    for name in policies:
        runs = [simulate(node, jobs, make_policy(name, rules), seed=seed, safety_net=rules.safety_net)
                for seed in range(seeds)]
        figures[name] = {
            "mean_jct_s": statistics.median(statistics.fmean(j["jct_s"] for j in run.jobs.values()) for run in runs),
            "gpu_busy": statistics.median(run.gpu_busy for run in runs),
            "makespan_s": statistics.median(max(run.jobs[job.name]["jct_s"] + job.arrival_s for job in jobs)
                                            for run in runs),
            "queued_s_mean": statistics.median(statistics.fmean(j["queued_s"] for j in run.jobs.values())
                                               for run in runs),
        }
    ratios = {name: {metric: value / figures["adaptive"][metric] for metric, value in entry.items()
                     if metric != "queued_s_mean" and figures["adaptive"][metric] > 0}
              for name, entry in figures.items() if "adaptive" in figures and name != "adaptive"}
    return {"mix": mix.name, "gpus": mix.gpus, "seeds": seeds, "policies": figures, "vs_adaptive": ratios}


def mix_lines(document: dict[str, Any]) -> list[str]:
    """A SIMULATED table of :func:`mix_figures`."""
    lines = [f"SIMULATED {document['mix']} (node GPUs: {document['gpus'] or 'not modelled'}), "
             f"medians of {document['seeds']} seeds"]
    for name, entry in document["policies"].items():
        ratio = document["vs_adaptive"].get(name)
        versus = (f"   vs adaptive: JCT {ratio['mean_jct_s']:.3f}x, busy {ratio['gpu_busy']:.3f}x, "
                  f"makespan {ratio['makespan_s']:.3f}x") if ratio else ""
        lines.append(f"  {name:>9}: mean JCT {entry['mean_jct_s']:6.1f} s (queued {entry['queued_s_mean']:5.1f} s), "
                     f"GPU busy {entry['gpu_busy']:.3f}, makespan {entry['makespan_s']:6.1f} s{versus}")
    return lines


# ---------------------------------------------------------------------------------------- main

def headroom_summary(check: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the seeded random mixes could gain over static at most (bench/replay.py's headroom),
    median over the mixes: a goal on the median gain is out of reach above it."""
    rows = [row["headroom_vs_static"] for row in check if row["mix"].startswith("random-")]
    if not rows:
        return {}
    unlimited = [row["simulated_unlimited_cores"] for row in rows]
    return {"mixes": len(rows),
            "measured_best_per_job_median": statistics.median(row["measured_best_per_job"] for row in rows),
            "simulated_unlimited_cores_median": statistics.median(unlimited),
            "simulated_unlimited_cores_under_1_05": sum(1 for ratio in unlimited if ratio < 1.05)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--jobs", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--crossing-jobs", type=int, nargs="+", default=[4, 8],
                        help="job counts of the crossing-phase mixes (every job changes phase)")
    parser.add_argument("--mixes", type=int, default=3, help="seeded mixes per node size and job count")
    parser.add_argument("--two-core-mixes", type=int, default=15,
                        help="seeded phase mixes per job count (2, 3, 4) on the measured 2-core node")
    parser.add_argument("--period", type=float, default=1.0, help="control period, s (the controller's default)")
    parser.add_argument("--settle-period", type=float, default=0.5,
                        help="control period while the node settles, s (the controller's default)")
    parser.add_argument("--quick", action="store_true", help="one mix per size, 64 cores and 4 jobs only")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--mix", type=Path, nargs="+", default=None, metavar="FILE",
                        help="instead: these mix files (bench/mixes/, queues included) on the measured 2-core node, "
                        "each policy of --policies, medians over --seeds")
    parser.add_argument("--policies", default="adaptive,jct", help="with --mix (default adaptive,jct)")
    parser.add_argument("--seeds", type=int, default=3, help="with --mix: seeded runs per policy (default 3)")
    parser.add_argument("--without", default=None, metavar="RULE[,RULE]",
                        help="for an ablation only: adaptive without these rules (controller/policies/rules.py)")
    args = parser.parse_args(argv)
    try:
        rules = parse_without(args.without)
    except PolicyError as exc:
        parser.error(str(exc))
    if args.mix:
        documents = [mix_figures(load_mix(path), args.policies.split(","), args.seeds, rules) for path in args.mix]
        for document in documents:
            for line in mix_lines(document):
                print(line)
        if args.json:
            write_json(args.json, {"simulated": True, "mixes": documents})
        return 0
    if args.quick:
        args.cores, args.jobs, args.crossing_jobs, args.mixes, args.two_core_mixes = [64], [4], [4], 1, 2
    started = time.perf_counter()

    def sim_node(cores: int) -> SimNode:
        return SimNode(cores=cores, disk_bps=DISK_BPS, period_s=args.period, settle_period_s=args.settle_period)

    scale = []
    print("SIMULATED (bench/sim_node.py): GPU-weighted busy, medians over mixes")
    print(f"{'node':>10} {'jobs':>4} {'static':>7} {'even':>7} {'adapt':>7} {'oracle':>7} {'a/static':>8} "
          f"{'a/even':>7} {'a/oracle':>8} {'phased/o':>8} {'settle':>7} {'phase':>6} {'chg/j-min':>9} {'ms/step':>8}")
    for cores in args.cores:
        for n in args.jobs:
            row = node_row(sim_node(cores), n, args.mixes, scale_mix, POLICIES, rules=rules)
            mixes, summary, med = row["mixes"], row["gpu_busy_median"], row["adaptive_ratio_median"]
            settle, phase_settle = slowest_settles(mixes)
            changes = statistics.median(m["policies"]["adaptive"]["changes_per_job_minute"] for m in mixes)
            decision = statistics.fmean(m["policies"]["adaptive"]["decision_ms_mean"] for m in mixes)
            scale.append({**row, "adaptive_settle_s_max": settle, "adaptive_phase_settle_s_max": phase_settle,
                          "adaptive_changes_per_job_minute_median": changes,
                          "adaptive_decision_ms_mean": decision})
            print(f"{cores:>5}c/8g {n:>4} {summary['static']:>7.3f} {summary['even']:>7.3f} {summary['adaptive']:>7.3f} "
                  f"{summary['oracle']:>7.3f} {med['adaptive_vs_static']:>7.3f}x {med['adaptive_vs_even']:>6.3f}x "
                  f"{med['adaptive_vs_oracle']:>7.3f}x {med['oracle_phased_vs_oracle']:>7.3f}x {settle:>6.1f}s "
                  f"{phase_settle:>5.1f}s {changes:>9.2f} {decision:>8.2f}")
    crossing = []
    print("\nCrossing phases (every job changes phase, half dearer x2.5, half cheaper x0.4; oversubscribed):")
    print(f"{'node':>10} {'jobs':>4} {'static':>7} {'oracle':>7} {'phased':>7} {'adapt':>7} {'a/oracle':>8} "
          f"{'phased/o':>8} {'a/static':>8} {'settle':>7} {'phase':>6}")
    for cores in args.cores:
        for n in args.crossing_jobs:
            row = node_row(sim_node(cores), n, args.mixes, crossing_mix, CROSSING_POLICIES, rules=rules)
            settle, phase_settle = slowest_settles(row["mixes"])
            crossing.append({**row, "adaptive_settle_s_max": settle, "adaptive_phase_settle_s_max": phase_settle})
            summary, med = row["gpu_busy_median"], row["adaptive_ratio_median"]
            print(f"{cores:>5}c/8g {n:>4} {summary['static']:>7.3f} {summary['oracle']:>7.3f} "
                  f"{summary['oracle_phased']:>7.3f} {summary['adaptive']:>7.3f} {med['adaptive_vs_oracle']:>7.3f}x "
                  f"{med['oracle_phased_vs_oracle']:>7.3f}x {med['adaptive_vs_static']:>7.3f}x {settle:>6.1f}s "
                  f"{phase_settle:>5.1f}s")
    two_core = []
    print("\nPhase changes on the measured 2-core node (1-2 jobs 2-4x dearer mid-run; oversubscribed 1-2x):")
    print(f"{'node':>10} {'jobs':>4} {'static':>7} {'oracle':>7} {'phased':>7} {'adapt':>7} "
          f"{'a/oracle (min-max)':>19} {'phased/o (min-max)':>19} {'give-backs':>10} {'a/static (min)':>15} "
          f"{'settle':>7} {'phase':>6}")
    for n in (2, 3, 4):
        row = node_row(measured_node(args.period, args.settle_period), n, args.two_core_mixes, two_core_phase_mix,
                       CROSSING_POLICIES, gpus=None, rules=rules)
        settle, phase_settle = slowest_settles(row["mixes"])
        row = {**row, "adaptive_settle_s_max": settle, "adaptive_phase_settle_s_max": phase_settle}
        two_core.append(row)
        summary, med = row["gpu_busy_median"], row["adaptive_ratio_median"]
        low, high = row["adaptive_ratio_min"], row["adaptive_ratio_max"]
        reverts = sum(m["policies"]["adaptive"]["safety_net_reverts"] for m in row["mixes"])
        print(f"{'2c':>10} {n:>4} {summary['static']:>7.3f} {summary['oracle']:>7.3f} {summary['oracle_phased']:>7.3f} "
              f"{summary['adaptive']:>7.3f} {med['adaptive_vs_oracle']:>6.3f}x ({low['adaptive_vs_oracle']:.2f}-"
              f"{high['adaptive_vs_oracle']:.2f}) {med['oracle_phased_vs_oracle']:>6.3f}x "
              f"({low['oracle_phased_vs_oracle']:.2f}-{high['oracle_phased_vs_oracle']:.2f}) {reverts:>10} "
              f"{med['adaptive_vs_static']:>6.3f}x ({low['adaptive_vs_static']:.2f}) {settle:>6.1f}s {phase_settle:>5.1f}s")
    pairs = []
    print("\nCrossing pairs on the measured 2-core node (two 1-GPU jobs, one cheap then dearer, the other the "
          "reverse, phases at half-way):")
    print(f"{'need':>5} {'dearer':>6} {'static':>7} {'even':>7} {'oracle':>7} {'phased':>7} {'adapt':>7} "
          f"{'a/oracle':>8} {'phased/o':>8} {'a/static':>8} {'a/phased':>8}")
    for need, factor in CROSSING_PAIRS[:1] if args.quick else CROSSING_PAIRS:
        pair = run_mix(measured_node(args.period, args.settle_period), crossing_pair(need, factor), seed=1,
                       policies=("static", "even", "adaptive", "oracle", "oracle_phased"), rules=rules)
        pairs.append({"need_cores": need, "dearer": factor, **pair})
        busy, ratio = {k: v["gpu_busy"] for k, v in pair["policies"].items()}, pair["ratios"]
        print(f"{need:>5.1f} {factor:>5.1f}x {busy['static']:>7.3f} {busy['even']:>7.3f} {busy['oracle']:>7.3f} "
              f"{busy['oracle_phased']:>7.3f} {busy['adaptive']:>7.3f} {ratio['adaptive_vs_oracle']:>7.3f}x "
              f"{ratio['oracle_phased_vs_oracle']:>7.3f}x {ratio['adaptive_vs_static']:>7.3f}x "
              f"{ratio['adaptive_vs_oracle_phased']:>7.3f}x")
    check = reality_check(measured_documents(), seeds=1 if args.quick else 3, rules=rules)
    print("\nCheck against the measured 2-core runs (GPU-emulated there, simulated here): adaptive/static, adaptive/even")
    for row in check:
        s, e = row["adaptive_vs_static"], row["adaptive_vs_even"]
        print(f"  {row['mix']:<14} measured {s['measured']:.3f}x {e['measured']:.3f}x   simulated {s['simulated']:.3f}x "
              f"{e['simulated']:.3f}x   difference {s['difference_pct']:+.1f}% {e['difference_pct']:+.1f}%")
    differences = abs_differences_pct(check)
    if differences:
        print(f"  |difference|: median {statistics.median(differences):.1f}%, largest {max(differences):.1f}%")
    headroom = headroom_summary(check)
    if headroom:
        print(f"Headroom over static on the random mixes: every job at its best measured busy: median "
              f"{headroom['measured_best_per_job_median']:.3f}x; simulated with unlimited cores: median "
              f"{headroom['simulated_unlimited_cores_median']:.3f}x, under 1.05x on "
              f"{headroom['simulated_unlimited_cores_under_1_05']} of {headroom['mixes']} mixes")
    document = {
        "benchmark": "adloader policies at 8-GPU scale, SIMULATED (bench/sim_node.py drives the real policies)",
        **({"adaptive_without": list(rules.off)} if rules.off else {}),
        "machine": machine.describe(),
        "period_s": args.period, "settle_period_s": args.settle_period, "scale": scale, "crossing_phases": crossing,
        "two_core_phases": two_core, "crossing_pairs": pairs, "reality_check": check,
        "random_mix_headroom_vs_static": headroom,
        "reality_check_abs_difference_pct": {"median": statistics.median(differences) if differences else None,
                                             "max": max(differences, default=None)},
        "wall_s": time.perf_counter() - started,
    }
    if args.json:
        write_json(args.json, document)
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
