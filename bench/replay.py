"""The measured 2-core runs as the node model's inputs, and how the model's constants were fitted.

``python -m bench.simulate`` replays the shipped and the seeded random mixes in the model
(bench/sim_node.py) and compares its ratios with the measured ones. What the replay takes
from the runs are their inputs and component measurements, never their ratios:

- each replayed job's CPU seconds per sample (``job_cpu_costs``): its loader CPU (workers and
  main process) over its samples in every run of its mix, each run's oversubscription
  inflation taken out, and a phased job's later phase (``phase_dearness``); a job with Python
  work in its training loop costs what its image side costs (``jpeg_cost_s``) and that work
  apart (``SimJob.trainer_s_per_sample``), as the controller keeps its training process;
- the disk's bytes/s by reads in flight (``measured_disk_curve``, bench/disk_readers.py);
- the node's quota response (``quota_response``, sim_node.QUOTA_TABLE): under ``even``, the
  busy fraction each job reached against its quota over the cores its rate needs;
- the fetch time no prefetching hides (``fit_fetch``, FETCH_*): the training loop's time per
  batch beyond its GPU step, for the jobs whose loaders kept up.

The last two are constants (of sim_node and of this module), fitted with ``python -m
bench.replay``: it prints the fits next to the constants, and how well the fetch fitted on
the odd random mixes alone replays the other mixes. Refit them when the runs are retaken on another machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from bench.sim_node import (
    OVERSUBSCRIPTION_COST,
    QUOTA_TABLE,
    SimJob,
    SimNode,
    oversubscription_inflation,
    simulate,
)
from controller.policies import AdaptiveRules, make_policy

RESULTS = Path(__file__).resolve().parent / "results"
NODE_CORES = 2
"""The cores of the node the measured runs ran on."""
UNLIMITED_CORES = 64
"""Cores enough for any 2-core mix's jobs at full speed: with them, and the disk at its best
whatever the reads in flight, static shows the most a mix could gain over static at all."""
QUOTA_BINS = (0.0, 0.45, 0.7, 0.95, 1.1, 1.3, 1.6, 2.2, 3.5, math.inf)
"""Edges of the quota / need bins whose medians make the quota response."""
FETCH_S_PER_SAMPLE = 0.112e-3
FETCH_CONTENTION_S_PER_SAMPLE = 0.0198e-3
"""Main-process time a sample costs between its batch being ready and the next step starting,
which no prefetching hides (taking the batch off the queue, waking from the step's sleep):
FETCH_S_PER_SAMPLE plus FETCH_CONTENTION_S_PER_SAMPLE for every DataLoader worker per core
on the node, for the replayed 2-core runs. Fitted by ``python -m bench.replay`` (median
regression of the loop time per batch beyond the GPU step, no intercept, on the static, even
and adaptive runs of the jobs whose loaders kept up; bench/results of 2026-11-24):
a 32-sample batch costs 4.4 ms at 1.3 workers per core and 6.8 ms at 5, so a job whose loader
keeps up is busy 0.96 or 0.94 of a 100 ms step, not all of it. Without it the replayed static
runs were 5% and adaptive 4% busier than measured, the even runs 4% idler."""
MEASURED_COST_S = {96: 0.00056, 160: 0.00089, 224: 0.00144, 320: 0.00247, 448: 0.00448, 512: 0.00585}
"""CPU seconds per sample of the JPEG pipeline by image side: the loader CPU per sample of
the JPEG jobs of the seeded random mixes (bench/results/node_random.json, 2026-11-24 08:17,
medians by side over its 360 JPEG job runs under static, even and adaptive), each divided
by the oversubscription inflation of its run's time-averaged workers per core, which leaves
the three policies within 5% of each other at every side; 512 px (readers only there) by
448 px's cost per pixel. node.json's true curves, used before, were 13-36% dearer, most for
the largest images: they are samples per core-second under a quota, which the quota's burst
cost lowers."""
OVERSUBSCRIPTION_COST_BY_SIDE = {96: 0.011, 160: 0.058, 224: 0.035, 320: 0.072, 448: 0.213}
"""How much a JPEG sample's CPU cost grows per e-fold of DataLoader workers per core on the node,
by image side (sim_node.SimJob.oversubscription_cost): fitted by ``python -m bench.replay``
(``fit_oversubscription``) on every measured run of bench/results (2026-11-25). Small images
lose 1-7% per e-fold, 448 px ones 21%; likely (not measured) because a 448 px worker's decoded
image and its resized copies (~0.6 MB each) no longer fit beside another worker's in a core's
2 MiB L2, so each switch between workers refetches them. With one figure for all sides
(OVERSUBSCRIPTION_COST, 0.085), the model's ``static`` on seeded random mix 9 (eight workers of
a 448 px job among 28 on two cores) was 19% busier than measured, and its adaptive/static ratio
20% off."""

RAW_READ_COST_S = 0.00045
"""CPU seconds per sample of a raw O_DIRECT reader (node.json, speech-io-1g)."""
STARTUP_S = 3.0
"""Seconds a job of the measured 2-core runs spent outside its training loop (job completion
time less the loop's duration: process start, imports, dataset, workers, and its exit):
median 3.0 s over the 336 job runs of bench/results/node.json and node_random.json, 2.0 to
5.2 s between the 10th and 90th percentile (the figure depends little on the policy)."""
DISK_BPS = 650e6
"""What the disk gave to O_DIRECT readers here (600-1000 MB/s measured; 637 MB/s in mix 5):
the scale rows' disk, whatever the reads in flight (how a 64-core node's drive answers to
more reads in flight was not measured here)."""


@functools.cache
def measured_disk_curve(path: Path = RESULTS / "disk_readers.json") -> tuple[tuple[int, float], ...]:
    """(reads in flight, bytes/s) of this machine's disk as ``python -m bench.disk_readers``
    measured it, for replaying the 2-core runs (empty if it was not measured); read once,
    not once per replayed mix."""
    if not path.exists():
        return ()
    document = json.loads(path.read_text())
    return tuple(sorted((int(w), float(v["read_bps"])) for w, v in document["workers"].items()))


def measured_documents(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every measured 2-core run document: the shipped mixes and the seeded random ones."""
    documents = [json.loads((results / name).read_text()) for name in ("node.json", "node_real.json")
                 if (results / name).exists()]
    random_runs = results / "node_random.json"
    if random_runs.exists():
        documents += json.loads(random_runs.read_text())["mixes"]
    return documents


def workers_per_core(repeat: Mapping[str, Any], specs: Mapping[str, Mapping[str, Any]],
                     cores: int = NODE_CORES) -> float:
    """DataLoader workers per core of one run, averaged over its time (running jobs only; a job
    the controller never resized has the workers it asked for)."""
    average = _time_average(repeat, lambda allocation: sum(
        fields[2] if fields[2] is not None else specs[name]["num_workers"]
        for name, fields in allocation.items() if fields[4] == "running"))
    return (average or 0.0) / cores


def _time_average(repeat: Mapping[str, Any], value: Callable[[Mapping[str, Any]], float | None]) -> float | None:
    """``value`` of the allocation in force, averaged over the time it is not None in one run
    (the benchmark samples the allocations twice a second); None when it never is."""
    samples = repeat.get("allocations") or []
    total = span = 0.0
    for (t0, allocation), (t1, _) in zip(samples, samples[1:]):
        if (v := value(allocation)) is not None:
            total += v * (t1 - t0)
            span += t1 - t0
    return total / span if span > 0 else None


def _job_runs(document: Mapping[str, Any], policies: Sequence[str] | None = None
              ) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]]:
    """(policy, the run, the job's spec, the job's measured figures) of every job of every run."""
    specs = {spec["name"]: spec for spec in document["mix"]["jobs"]}
    for policy, figures in (document.get("policies") or {}).items():
        if policies is not None and policy not in policies:
            continue
        for repeat in figures.get("repeats", []):
            for name, job in repeat["jobs"].items():
                yield policy, repeat, specs[name], job


def _plain(spec: Mapping[str, Any]) -> bool:
    """A job whose loader CPU is all loading and whose cost does not change mid-run."""
    return spec.get("phase_after_s") is None and not _python_s_per_batch(spec)


def _python_s_per_batch(spec: Mapping[str, Any]) -> float:
    """Seconds of Python work the job's training loop does per batch (0: none)."""
    return float(spec.get("python_ms_per_batch") or 0.0) / 1000.0


def job_cpu_costs(document: Mapping[str, Any]) -> dict[str, float]:
    """CPU seconds per sample of each job of a measured mix, at one worker per core and in its
    first phase: the median over its runs of loader CPU / samples, each divided by its run's
    oversubscription inflation and by how much dearer its later phase made its samples on
    average (``phase_dearness``). Jobs that do Python work in their training loop are left out
    (their CPU is not their loading's)."""
    specs = {spec["name"]: spec for spec in document["mix"]["jobs"]}
    costs: dict[str, list[float]] = {}
    for _, repeat, spec, job in _job_runs(document):
        if not _python_s_per_batch(spec) and job.get("samples"):
            inflation = oversubscription_inflation(workers_per_core(repeat, specs) * NODE_CORES, NODE_CORES,
                                                   oversubscription_cost(spec))
            costs.setdefault(spec["name"], []).append(
                job["loader_cpu_s"] / job["samples"] / inflation / phase_dearness(spec, job))
    return {name: statistics.median(values) for name, values in costs.items()}


def phase_dearness(spec: Mapping[str, Any], job: Mapping[str, Any]) -> float:
    """A run's mean cost per sample over its first phase's, for a job whose samples cost
    ``phase_cost / first_phase_cost`` times more from ``phase_after_s`` after its start (1 for
    a job of one phase). Its samples are taken as spread evenly over its training loop, which
    starts STARTUP_S after the process: a run that got through its first phase faster put more
    samples in it than that, so its first phase's cost comes out a little low."""
    phase_after = spec.get("phase_after_s")
    if phase_after is None or not job.get("loop_s"):
        return 1.0
    later = float(spec.get("phase_cost", 1)) / float(spec.get("first_phase_cost", 1))
    first_share = min(1.0, max(0.0, float(phase_after) - STARTUP_S) / job["loop_s"])
    return first_share + later * (1.0 - first_share)


def oversubscription_cost(spec: Mapping[str, Any]) -> float:
    """How much a sample of the job of ``spec`` costs more per e-fold of workers per core
    (OVERSUBSCRIPTION_COST_BY_SIDE at its image side's nearest, by pixels; the simulator's
    default for a raw reader)."""
    if spec.get("io_bound"):
        return OVERSUBSCRIPTION_COST
    pixels = spec["image_px"] ** 2
    return min(OVERSUBSCRIPTION_COST_BY_SIDE.items(), key=lambda item: abs(item[0] ** 2 - pixels))[1]


def fit_oversubscription(documents: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Per image side, the relative growth of a JPEG sample's CPU cost per e-fold of workers per
    core: a least-squares line of (loader CPU / samples / MEASURED_COST_S) against
    ln(workers per core, at least 1) over the plain JPEG job runs of ``documents``, its slope over
    its intercept (sides with fewer than ten runs are left out)."""
    runs: dict[int, list[tuple[float, float]]] = {}
    for document in documents:
        specs = {spec["name"]: spec for spec in document["mix"]["jobs"]}
        for _, repeat, spec, job in _job_runs(document):
            if _plain(spec) and not spec.get("io_bound") and job.get("samples") and spec["image_px"] in MEASURED_COST_S:
                per_core = max(1.0, workers_per_core(repeat, specs))
                cost = job["loader_cpu_s"] / job["samples"] / MEASURED_COST_S[spec["image_px"]]
                runs.setdefault(spec["image_px"], []).append((math.log(per_core), cost))
    fits = {}
    for side, points in sorted(runs.items()):
        if len(points) >= 10:
            slope, intercept = statistics.linear_regression(*zip(*points))
            fits[side] = slope / intercept
    return fits


def jpeg_cost_s(side_px: int) -> float:
    """CPU seconds per sample of the JPEG pipeline for ``side_px``: linear in pixels between the
    sides measured (a fixed part and a part per pixel: 96 px cost 0.66 ms, not the 0.28 ms its
    pixels would at 224 px's rate), the last segment extended beyond them. Scaling the nearest
    measured side by area made a 160 px job 1.83 ms instead of 1.05."""
    knots = sorted((side * side, cost) for side, cost in MEASURED_COST_S.items())
    pixels = side_px * side_px
    for (x0, y0), (x1, y1) in zip(knots, knots[1:]):
        if pixels <= x1 or (x1, y1) == knots[-1]:
            return max(1e-6, y0 + (y1 - y0) * (pixels - x0) / (x1 - x0))
    return knots[-1][1]


def jobs_from_measured_mix(document: Mapping[str, Any]) -> tuple[list[SimJob], SimNode]:
    """The jobs of a measured 2-core benchmark run as simulated jobs, and the node they ran on
    (its read bandwidth and control periods; a run from before the settle period stepped at
    one period throughout). A job costs what its runs measured (``job_cpu_costs``), else what
    the oracle's probe measured (its true curve), else what its image side costs."""
    curves = document.get("true_curves") or {}
    measured = job_cpu_costs(document)
    jobs = []
    for spec in document["mix"]["jobs"]:
        m = spec["batch_size"] / (spec["compute_ms_per_batch"] / 1000.0)
        true = curves.get(spec["name"]) or {}
        b = float(true.get("bytes_per_sample", spec["image_px"] ** 2 * 3 if spec.get("io_bound") else 0.0))
        python_s = _python_s_per_batch(spec)
        if spec["name"] in measured:
            p = measured[spec["name"]]
        elif python_s > 0:  # its probe's CPU counted its training loop's Python work: apart now
            p = jpeg_cost_s(spec["image_px"]) * spec.get("first_phase_cost", 1)
        elif true:
            p = true.get("cpu_s_per_sample") or 1.0 / true["loading_curve"][0][1]
        else:
            p = (RAW_READ_COST_S if spec.get("io_bound") else jpeg_cost_s(spec["image_px"])) * spec.get(
                "first_phase_cost", 1)
        phase_after = spec.get("phase_after_s")
        jobs.append(SimJob(name=spec["name"], gpus=spec["gpus"], max_throughput=m, cpu_s_per_sample=p,
                           samples=float(spec["samples"]), arrival_s=float(spec["arrival_s"]),
                           requested_workers=int(spec["num_workers"]), batch_size=int(spec["batch_size"]),
                           bytes_per_sample=b, concavity=0.0, startup_s=STARTUP_S,
                           oversubscription_cost=oversubscription_cost(spec),
                           phases=((float(phase_after), float(spec.get("phase_cost", 1))
                                    / float(spec.get("first_phase_cost", 1))),)
                           if phase_after is not None else (),
                           # Python work in the training loop, between a batch and its step: never more
                           # than a batch per (that work + the step), whatever the loader's cores
                           python_cap=spec["batch_size"] / (python_s + spec["compute_ms_per_batch"] / 1000.0)
                           if python_s > 0 else math.inf,
                           trainer_s_per_sample=python_s / spec["batch_size"]))
    node = document.get("node", {})
    period = float(node.get("period_s", 0.5))
    return jobs, measured_node(period, float(node.get("settle_period_s", period)), node.get("read_bps"))


def measured_node(period_s: float, settle_period_s: float, read_bps: float | None = None) -> SimNode:
    """The 2-core node the benchmarks ran on, as the simulator models it: its disk's measured
    curve and the fetch time fitted on its runs; ``read_bps``: the bandwidth the controller managed."""
    return SimNode(cores=NODE_CORES, disk_bps=DISK_BPS, disk_curve=measured_disk_curve(), read_bps=read_bps,
                   period_s=period_s, settle_period_s=settle_period_s, fetch_s_per_sample=FETCH_S_PER_SAMPLE,
                   fetch_contention_s_per_sample=FETCH_CONTENTION_S_PER_SAMPLE)


def reality_check(documents: Sequence[Mapping[str, Any]], seeds: int = 3,
                  fetch: tuple[float, float] | None = None, rules: AdaptiveRules = AdaptiveRules()
                  ) -> list[dict[str, Any]]:
    """Per measured mix: measured and simulated GPU-busy ratios of adaptive to static and to
    even; ``fetch`` replaces the model's fetch constants (seconds per sample, and per sample
    per worker per core); ``rules``: adaptive's rules on (an ablation)."""
    rows = []
    for document in documents:
        measured = {p: v["gpu_busy"] for p, v in document["policies"].items()}
        if not {"adaptive", "static", "even"} <= set(measured):
            continue
        jobs, node = jobs_from_measured_mix(document)
        if fetch is not None:
            node = dataclasses.replace(node, fetch_s_per_sample=fetch[0], fetch_contention_s_per_sample=fetch[1])
        simulated: dict[str, list[float]] = {p: [] for p in ("static", "even", "adaptive")}
        for seed in range(seeds):
            for name in simulated:
                simulated[name].append(simulate(node, jobs, make_policy(name, rules), seed=seed,
                                                safety_net=rules.safety_net).gpu_busy)
        sim = {p: statistics.median(v) for p, v in simulated.items()}
        row: dict[str, Any] = {"mix": document["mix"]["name"], "measured_gpu_busy": measured,
                               "simulated_gpu_busy": sim}
        for base in ("static", "even"):
            real = measured["adaptive"] / measured[base]
            model = sim["adaptive"] / sim[base]
            row[f"adaptive_vs_{base}"] = {"measured": real, "simulated": model, "difference_pct": 100 * (model / real - 1)}
        unlimited = dataclasses.replace(node, cores=UNLIMITED_CORES, read_bps=None, disk_curve=(),
                                        disk_bps=max((bps for _, bps in node.disk_curve), default=node.disk_bps))
        row["headroom_vs_static"] = {
            "measured_best_per_job": best_per_job_vs_static(document),
            "simulated_unlimited_cores": statistics.median(
                simulate(unlimited, jobs, make_policy("static"), seed=seed).gpu_busy for seed in range(seeds))
            / sim["static"]}
        rows.append(row)
    return rows


def best_per_job_vs_static(document: Mapping[str, Any]) -> float:
    """The gain over ``static`` its runs show within reach: every job at the best busy fraction
    it reached in any run of its mix under any policy, weighted as static's GPU busy is (GPUs x
    its training loop's time), over static's GPU busy. An estimate, not a bound: a policy that
    shortens the slow jobs' loops weighs them less (adaptive's own ratio exceeded it by up to
    5% on the random mixes of 2026-11-24)."""
    best: dict[str, float] = {}
    for _, _, spec, job in _job_runs(document):
        best[spec["name"]] = max(best.get(spec["name"], 0.0), job["busy_fraction"])
    ratios = []
    for _, _, spec, job in _job_runs(document, ("static",)):
        weight = spec["gpus"] * job["loop_s"]
        ratios.append((weight * best[spec["name"]], weight * job["busy_fraction"]))
    return sum(b for b, _ in ratios) / sum(s for _, s in ratios)


def abs_differences_pct(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """|simulated / measured - 1| of every ratio of ``reality_check``'s rows, in percent."""
    return [abs(row[k]["difference_pct"]) for row in rows for k in ("adaptive_vs_static", "adaptive_vs_even")]


def quota_response(documents: Sequence[Mapping[str, Any]], fetch_s: float = FETCH_S_PER_SAMPLE,
                   contention_s: float = FETCH_CONTENTION_S_PER_SAMPLE) -> tuple[tuple[float, float], ...]:
    """(quota / cores its rate needs, share of that rate reached) medians by bin, over the plain
    JPEG jobs of the ``even`` runs (which give every job a quota); the need is at the job's
    fetch ceiling, and the share is its busy fraction over that ceiling."""
    node = SimNode(cores=NODE_CORES, fetch_s_per_sample=fetch_s, fetch_contention_s_per_sample=contention_s)
    points = []
    for document in documents:
        specs = {spec["name"]: spec for spec in document["mix"]["jobs"]}
        for _, repeat, spec, job in _job_runs(document, ("even",)):
            if not _plain(spec) or spec.get("io_bound") or not job.get("samples"):
                continue
            quota = _time_average(repeat, lambda allocation: _running_quota(allocation.get(spec["name"])))
            if quota is None:
                continue
            m = spec["batch_size"] / (spec["compute_ms_per_batch"] / 1000.0)
            rate = node.fetch_ceiling(m, 1, workers_per_core(repeat, specs))
            need = rate * job["loader_cpu_s"] / job["samples"]
            points.append((quota / need, job["busy_fraction"] * m / rate))
    table = [(0.0, 0.0)]
    for low, high in zip(QUOTA_BINS, QUOTA_BINS[1:]):
        inside = [point for point in points if low <= point[0] < high]
        if inside:
            share = min(1.0, statistics.median(share for _, share in inside))
            table.append((round(statistics.median(ratio for ratio, _ in inside), 2), round(max(share, table[-1][1]), 3)))
    return tuple(table)


def _running_quota(fields: Sequence[Any] | None) -> float | None:
    """A job's quota in an allocation sample while it runs under one."""
    return fields[0] if fields and fields[4] == "running" and fields[0] else None


def fit_fetch(documents: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """(seconds per sample, seconds per sample per worker per core) of the fetch time: a median
    regression of each job run's loop time per batch beyond its step on batch size and batch
    size x workers per core, over the static/even/adaptive runs of the jobs the model without
    fetch time finds kept up (busy above 0.99: whatever they lost, their loaders did not)."""
    import numpy as np  # the fit's dependencies, not the replay's
    from sklearn.linear_model import QuantileRegressor

    features, overheads = [], []
    for document in documents:
        jobs, node = jobs_from_measured_mix(document)
        node = dataclasses.replace(node, fetch_s_per_sample=0.0, fetch_contention_s_per_sample=0.0)
        specs = {spec["name"]: spec for spec in document["mix"]["jobs"]}
        for policy in ("static", "even", "adaptive"):
            if policy not in document["policies"]:
                continue
            modelled = simulate(node, jobs, make_policy(policy), seed=0).jobs
            kept_up = {name for name, job in modelled.items() if job["wall_s"] and job["busy_s"] / job["wall_s"] > 0.99}
            for _, repeat, spec, job in _job_runs(document, (policy,)):
                if spec["name"] not in kept_up:
                    continue
                step_s = spec["compute_ms_per_batch"] / 1000.0
                batches = job["busy_fraction"] * job["loop_s"] / step_s
                per_core = workers_per_core(repeat, specs)
                features.append([spec["batch_size"], spec["batch_size"] * per_core])
                overheads.append(job["loop_s"] / batches - step_s)
    fit = QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs", fit_intercept=False).fit(
        np.array(features), np.array(overheads))
    return float(fit.coef_[0]), float(fit.coef_[1])


def _is_calibration_half(document: Mapping[str, Any]) -> bool:
    name = document["mix"]["name"]
    return name.startswith("random-") and int(name.split("-")[1]) % 2 == 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the measured run documents are")
    args = parser.parse_args(argv)
    documents = measured_documents(args.results)
    print(f"fits over the {len(documents)} measured 2-core mixes of {args.results}")
    fetch, contention = fit_fetch(documents)
    print(f"fetch, all mixes: {1e3 * fetch:.4f} ms/sample + {1e3 * contention:.4f} ms/sample per worker per core "
          f"(bench/replay.py: {1e3 * FETCH_S_PER_SAMPLE:.4f} + {1e3 * FETCH_CONTENTION_S_PER_SAMPLE:.4f})")
    fits = {side: round(cost, 3) for side, cost in fit_oversubscription(documents).items()}
    print(f"oversubscription cost by side: {fits} (bench/replay.py: {OVERSUBSCRIPTION_COST_BY_SIDE})")
    print(f"quota response (quota / need, share): {quota_response(documents, fetch, contention)}")
    print(f"                            sim_node: {QUOTA_TABLE}")
    half = [document for document in documents if _is_calibration_half(document)]
    held_out = [document for document in documents if not _is_calibration_half(document)]
    fitted = fit_fetch(half)
    print(f"fetch, odd random mixes only: {1e3 * fitted[0]:.4f} + {1e3 * fitted[1]:.4f}; with it, the other mixes:")
    for name, check in (("odd-mix fit", reality_check(held_out, fetch=fitted)), ("all-mix fit", reality_check(held_out))):
        differences = abs_differences_pct(check)
        print(f"  {name:<12} |simulated/measured - 1| median {statistics.median(differences):.1f}%, "
              f"largest {max(differences):.1f}% over {len(check)} held-out mixes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
