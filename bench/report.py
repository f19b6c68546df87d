"""Scores benchmark runs and reports them: a table, a JSON document and a plot.

Per run (all numbers GPU-emulated: a job's GPU step is a sleep):
- ``gpu_busy``: GPU-weighted busy fraction Σ g·busy / Σ g·wall, with busy a job's
  emulated compute time and wall its training loop's duration (first batch asked
  for to last step done);
- ``samples_per_s``: all samples of all jobs / makespan;
- ``makespan_s``: first arrival to the last job's exit;
- ``mean_jct_s``: mean of (exit − arrival) over jobs, time waiting for GPUs included (a mix
  with ``"gpus"``; each job's ``queued_s``, ``start_s`` and ``end_s`` say where it went);
- ``controller_cpu_pct``: the controller's CPU time / run wall time, % of one core;
- ``controller_wait_pct``: the time its control loop's thread waited for a CPU (run queue,
  controller/cpu_wait.py) / run wall time, %: near 0 when its weight shields it from the jobs;
- ``settle_s``: after each event (a job registers, a job's first report arrives, a job
  departs), how long until no job's allocation moved any more before the next event: its
  workers, its quota or its CPU weight (by more than 0.05 cores, a weight of 100 being
  one core; "none" counts as a value); the largest is reported. A change is charged to
  the latest event before it: the even share a registering job gets is its registration's,
  not the previous arrival's;
- ``phase_settle_s``: the same after each phase change of a job of the mix (None: no job
  changes phase); a phase change ends the settling of the event before it;
- ``changes_per_job_minute``: how often a job's quota, CPU weight or workers changed
  (after its first allocation), per minute of job lifetime, summed over jobs.

Per job, besides its busy fraction and times: ``worker_memory``, what one of its loader workers
cost at the most the controller measured it (MiB; its own pages and its share of the prefetched
batches; ``exact`` False where only the cheap upper bound was ever read, for a job with room to
spare) and how many workers its memory held at the last measurement (``workers_memory_limit``,
all ranks), from the status samples.

A policy's figure is the median over its repeats.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Iterable, Sequence

from adloader.errors import AdloaderError
from bench.runner import RunOutcome


class PlotUnavailable(AdloaderError):
    """matplotlib (the ``plot`` extra) is not installed."""

METRICS = ("gpu_busy", "samples_per_s", "makespan_s", "mean_jct_s", "controller_cpu_pct", "controller_wait_pct",
           "settle_s", "changes_per_job_minute")
HIGHER_IS_BETTER = {"gpu_busy": True, "samples_per_s": True, "makespan_s": False, "mean_jct_s": False}
BASELINES = ("even", "static", "oracle", "oracle-phased")
SETTLE_CORES = 0.05
LABEL = "GPU-emulated"


def _startup_s(timeline: dict[str, Any]) -> float | None:
    """Seconds from the job's process start to its training loop (imports, dataset, workers)."""
    start, loop = timeline.get("process_start"), timeline.get("loop_start")
    return loop - start if isinstance(start, (int, float)) and isinstance(loop, (int, float)) else None


def score_run(run: RunOutcome) -> dict[str, Any]:
    """The metrics of one run, plus each job's own."""
    jobs = {}
    weighted_busy = weighted_wall = total_samples = 0.0
    for outcome in run.jobs:
        timeline = outcome.timeline or {}
        busy, wall = float(timeline.get("busy_s", 0.0)), float(timeline.get("loop_s", 0.0))
        g = max(1, outcome.spec.gpus)
        weighted_busy += g * busy
        weighted_wall += g * wall
        total_samples += float(timeline.get("samples", 0))
        jobs[outcome.spec.name] = {
            "gpus": outcome.spec.gpus,
            "busy_fraction": busy / wall if wall > 0 else 0.0,
            "jct_s": (outcome.ended_s or 0.0) - outcome.spec.arrival_s,
            # in the queue for the node's GPUs (a mix with "gpus"), then running: from arrival
            "queued_s": outcome.launched_s - outcome.spec.arrival_s,
            "start_s": outcome.launched_s,
            "end_s": outcome.ended_s,
            "samples": timeline.get("samples", 0),
            "loader_cpu_s": timeline.get("cpu_s"),  # the job's process and its workers
            "training_cpu_s": timeline.get("training_cpu_s"),  # the job's process alone
            "torch_threads": timeline.get("torch_threads"),
            # where the job's GPU idled (the simulator's check against reality needs them apart):
            # waiting for batches, waking late from its steps on a contended CPU, and starting
            "wait_s": timeline.get("wait_s"),
            "sleep_overrun_s": timeline.get("sleep_overrun_s"),
            "loop_s": timeline.get("loop_s"),
            "startup_s": _startup_s(timeline),
            "worker_memory": worker_memory(run.samples, outcome.spec.name),
        }
    makespan = max((o.ended_s or 0.0) for o in run.jobs) - min(o.spec.arrival_s for o in run.jobs)
    settle, phase_settle = settle_times(run), settle_times(run, after_phases=True)
    return {
        "gpu_busy": weighted_busy / weighted_wall if weighted_wall > 0 else 0.0,
        "samples_per_s": total_samples / makespan if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "mean_jct_s": statistics.fmean(j["jct_s"] for j in jobs.values()),
        "controller_cpu_pct": 100.0 * run.controller_cpu_s / run.wall_s if run.wall_s > 0 else 0.0,
        "controller_wait_pct": 100.0 * run.controller_wait_s / run.wall_s if run.wall_s > 0 else 0.0,
        "settle_s": max(settle) if settle else 0.0,
        "settle_events_s": settle,
        "phase_settle_s": max(phase_settle) if phase_settle else None,
        "changes_per_job_minute": changes_per_job_minute(
            [(t, {name: (f.get("cores"), f.get("cpu_weight"), f.get("workers")) for name, f in js.items()})
             for t, js in run.samples]),
        "jobs": jobs,
        "allocations": [[t, {name: [f.get("cores"), f.get("cpu_weight"), f.get("workers"), f.get("read_bps"),
                                    f.get("state")]
                             for name, f in js.items()}] for t, js in run.samples],
        "allocations_fields": ["cores", "cpu_weight", "workers", "read_bps", "state"],
    }


def worker_memory(samples: Sequence[tuple[float, dict[str, dict]]], name: str) -> dict[str, Any] | None:
    """What a worker of job ``name`` cost at the most the controller measured it over the status
    ``samples`` (read exactly where it ever was, else the upper bound), and how many workers its
    memory held at the last measurement (the first ones hold a job at the workers it runs while
    their cost still grows); None if it was never measured."""
    seen = [fields for _, jobs in samples if (fields := jobs.get(name)) and fields.get("worker_memory_bytes")]
    if not seen:
        return None
    exact = [fields for fields in seen if fields.get("worker_memory_exact")]
    peak = max(exact or seen, key=lambda fields: fields["worker_memory_bytes"])
    limits = [fields["workers_memory_limit"] for fields in seen if fields.get("workers_memory_limit") is not None]
    return {
        "per_worker_mib": peak["worker_memory_bytes"] / 2**20,
        "prefetch_mib": (peak.get("worker_prefetch_bytes") or 0.0) / 2**20,
        "exact": bool(peak.get("worker_memory_exact")),
        "workers_memory_limit": limits[-1] if limits else None,
    }


def settle_times(run: RunOutcome, after_phases: bool = False) -> list[float]:
    """For each event seen in the status samples (a job registers, reports first, or
    departs), seconds until the allocation stopped moving (every job's limits within the
    tolerances of ``_moved`` of their values before the next event); ``after_phases``: for
    each phase change of a job of the mix instead. Registration and first report are
    separate events: counted from the first report alone, the even share given to a job
    registering in the meantime was charged to an earlier arrival (seeded random mix 5's
    9.6 s was the even share of a job registering 9.6 s after the first one reported). A phase
    change ends the settling of the event before it: the plan that follows a phase is not the
    arrival's (on crossing_pair_sharp the swap 19 s after the phases crossed was charged to the
    jobs' first reports, 40 s before)."""
    samples = [(t, {name: (f.get("cores"), f.get("workers"), f.get("cpu_weight")) for name, f in jobs.items()},
                frozenset((name, f.get("state", "running")) for name, f in jobs.items()))
               for t, jobs in run.samples]
    job_set = {i for i in range(1, len(samples)) if samples[i][2] != samples[i - 1][2]}
    phases = {i for phase_s in phase_changes_s(run) for i in range(1, len(samples))
              if samples[i - 1][0] < phase_s <= samples[i][0]}
    events = sorted(job_set | phases)
    counted = phases if after_phases else job_set
    result = []
    for n, index in enumerate(events):
        if index not in counted:
            continue
        end = events[n + 1] if n + 1 < len(events) else len(samples)
        window = samples[index:end]
        if not window or not window[0][1]:
            continue
        final = window[-1][1]
        differed = [i for i, (_, given, _) in enumerate(window)
                    if any(_moved(given.get(name), final[name]) for name in final)]
        # settled at the sample after the last one that differed; at once if none did
        settled_at = window[differed[-1] + 1][0] if differed else window[0][0]
        result.append(round(settled_at - window[0][0], 3))
    return result


def phase_changes_s(run: RunOutcome) -> list[float]:
    """Seconds after the run's start at which its jobs changed phase: each such job's process
    start plus its ``phase_after_s`` (bench/job.py times the phase from there)."""
    return sorted(
        outcome.timeline["process_start"] - run.started_at + outcome.spec.phase_after_s
        for outcome in run.jobs
        if outcome.spec.changes_phase and outcome.spec.phase_after_s is not None
        and outcome.timeline and outcome.timeline.get("process_start") is not None
    )


def changes_per_job_minute(samples: Sequence[tuple[float, dict[str, tuple]]]) -> float:
    """Allocation changes per job-minute from (time, {job: limits}) samples: a job counts a
    change each time its limits differ from its previous sample's (its first allocation,
    from nothing, is not a change); its minutes are the sampled time it was present."""
    changes = 0
    job_seconds = 0.0
    for (t0, before), (t1, after) in zip(samples, samples[1:]):
        present = set(before) & set(after)
        job_seconds += (t1 - t0) * len(present)
        changes += sum(1 for name in present if before[name] != after[name] and any(v is not None for v in before[name]))
    return 60.0 * changes / job_seconds if job_seconds > 0 else 0.0


Given = tuple[float | None, int | None, int | None]
"""(quota cores, workers, CPU weight) of a job in one status sample."""


def _moved(value: Given | None, final: Given) -> bool:
    if value is None:
        return True
    if value[1] != final[1]:
        return True
    for now, then, per_core in ((value[0], final[0], 1.0), (value[2], final[2], 100.0)):
        if (now is None) != (then is None):
            return True
        if now is not None and then is not None and abs(now - then) / per_core > SETTLE_CORES:
            return True
    return False


def summarise(runs: Iterable[RunOutcome]) -> dict[str, dict[str, Any]]:
    """Per policy: the median of each metric over repeats (of ``phase_settle_s``, over the
    repeats that had a phase change), and every repeat's scores."""
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(score_run(run))
    summary = {}
    for policy, scores in by_policy.items():
        entry: dict[str, Any] = {m: statistics.median(s[m] for s in scores) for m in METRICS}
        phase_settles = [s["phase_settle_s"] for s in scores if s["phase_settle_s"] is not None]
        entry["phase_settle_s"] = statistics.median(phase_settles) if phase_settles else None
        entry["repeats"] = scores
        summary[policy] = entry
    return summary


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """policy -> "vs_<baseline>" -> metric -> policy's median / baseline's median."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    for policy, entry in summary.items():
        for baseline in BASELINES:
            if baseline not in summary or baseline == policy:
                continue
            base = summary[baseline]
            result.setdefault(policy, {})[f"vs_{baseline}"] = {
                m: entry[m] / base[m] for m in HIGHER_IS_BETTER if base[m]
            }
    return result


def table(summary: dict[str, dict[str, Any]], order: Sequence[str]) -> str:
    """The stdout table: medians and ratios against the baselines present."""
    present = [p for p in order if p in summary]
    rel = ratios(summary)
    baselines = [b for b in BASELINES if b in summary]
    width = max([9, *(len(policy) for policy in present)])
    header = (f"{'policy':<{width}} {'GPU busy':>8} {'samples/s':>9} {'makespan':>8} {'mean JCT':>8} "
              f"{'ctl CPU':>7} {'ctl wait':>8} {'settle':>6} {'chg/job-min':>11}" + "".join(f" {'busy/' + b:>12}" for b in baselines)
              + "".join(f" {'mkspan/' + b:>13}" for b in baselines))
    lines = [f"{LABEL} node benchmark ({repeats_words(summary, present)})", header, "-" * len(header)]
    for policy in present:
        e = summary[policy]
        row = (f"{policy:<{width}} {e['gpu_busy']:>8.3f} {e['samples_per_s']:>9.1f} {e['makespan_s']:>7.1f}s "
               f"{e['mean_jct_s']:>7.1f}s {e['controller_cpu_pct']:>6.2f}% {e['controller_wait_pct']:>7.2f}% "
               f"{e['settle_s']:>5.1f}s "
               f"{e.get('changes_per_job_minute', 0.0):>11.2f}")
        for b in baselines:
            value = rel.get(policy, {}).get(f"vs_{b}", {}).get("gpu_busy")
            row += f" {value:>11.3f}x" if value is not None else f" {'-':>12}"
        for b in baselines:
            value = rel.get(policy, {}).get(f"vs_{b}", {}).get("makespan_s")
            row += f" {value:>12.3f}x" if value is not None else f" {'-':>13}"
        lines.append(row)
    return "\n".join(lines)


def repeats_words(summary: dict[str, dict[str, Any]], policies: Sequence[str]) -> str:
    """What the table's figures are: one run's, or medians over how many repeats."""
    counts = sorted({len(summary[p].get("repeats", ())) for p in policies})
    if counts in ([], [1]):
        return "one run per policy"
    many = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"medians over {many} runs per policy"


def legend(baselines: Sequence[str]) -> list[str]:
    """What each column of :func:`table` means, one line a column (printed under it, and in --help)."""
    lines = [
        "GPU busy: fraction of the run each job's GPUs computed rather than waited for data, GPU-weighted",
        "samples/s: every job's samples / makespan; makespan: first arrival to last job done; "
        "mean JCT: mean job completion time, arrival to exit",
        "ctl CPU: the controller's CPU time, % of one core; ctl wait: % of the time its control loop waited "
        "for a CPU (near 0: the jobs do not delay it)",
        "settle: the longest time, after a job arrived, first reported or left, until no job's cores, weight "
        "or workers moved any more",
        "chg/job-min: how often a job's cores, weight or workers changed, per minute of job life, summed over "
        "jobs (lower is calmer)",
    ]
    for b in baselines:
        lines.append(f"busy/{b}, mkspan/{b}: GPU busy and makespan as a multiple of {b}'s "
                     "(busy above 1x and makespan below 1x are better)")
    return lines


def headline(document: dict[str, Any], policy: str = "adaptive", baseline: str = "even") -> str | None:
    """One sentence of what ``policy`` did better or worse than ``baseline``, e.g. "adaptive kept the GPUs
    1.51x as busy as even and finished 32% sooner"; None when the document lacks either."""
    versus = document.get("ratios", {}).get(policy, {}).get(f"vs_{baseline}", {})
    busy, makespan = versus.get("gpu_busy"), versus.get("makespan_s")
    if busy is None or makespan is None:
        return None
    finish = (f"finished {1 - makespan:.0%} sooner" if makespan < 0.995 else
              f"took {makespan - 1:.0%} longer" if makespan > 1.005 else "finished in the same time")
    return f"{policy} kept the GPUs {busy:.2f}x as busy as {baseline} and {finish} ({LABEL})"


GOAL_WORDS = {
    "adaptive_vs_even_gpu_busy": "adaptive's GPUs busier than even's",
    "adaptive_vs_even_makespan": "adaptive's makespan against even's",
    "adaptive_vs_static_gpu_busy": "adaptive's GPUs busier than static's (each job's own settings)",
    "adaptive_vs_oracle_gpu_busy": "adaptive's GPUs busier than the oracle's searched split",
    "adaptive_vs_best_static_split_gpu_busy": "adaptive's GPUs busier than the best static split",
    "jct_mean_jct_vs_adaptive": "jct's mean completion time against adaptive's",
    "adaptive_settle_s": "adaptive settles after an arrival or departure, in seconds",
}
"""The goals of bench/node.py in words (the JSON keeps their names)."""


def goal_sentences(document: dict[str, Any]) -> list[str]:
    """Each goal as a plain line: what it asks, the measured value against its bar, met or missed."""
    lines = []
    for name, goal in document.get("goals", {}).items():
        words = GOAL_WORDS.get(name, name.replace("_", " "))
        unit = "s" if name.endswith("_s") else "x"
        against = f" ({goal['against']})" if "against" in goal else ""
        lines.append(f"{'met' if goal['met'] else 'missed'}: {words}{against}: {goal['value']:.2f}{unit}, "
                     f"asked {goal['bar']}{unit}")
    return lines


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")


def busy_series(timeline: dict, offset_s: float, window_s: float = 2.0, step_s: float = 0.5) -> tuple[list[float], list[float]]:
    """A job's GPU busy fraction over time: emulated compute inside a sliding window.
    ``offset_s`` shifts the job's own clock onto the run's (seconds after the run's start)."""
    steps = timeline.get("steps", [])
    if not steps:
        return [], []
    intervals = [(offset_s + t, offset_s + t + c) for t, _, c in steps]
    first, last = offset_s, intervals[-1][1]
    times, values = [], []
    t = first + window_s / 2
    j = 0
    while t <= last:
        lo, hi = t - window_s / 2, t + window_s / 2
        while j < len(intervals) and intervals[j][1] < lo:
            j += 1
        busy = 0.0
        k = j
        while k < len(intervals) and intervals[k][0] < hi:
            busy += max(0.0, min(hi, intervals[k][1]) - max(lo, intervals[k][0]))
            k += 1
        times.append(t)
        values.append(busy / window_s)
        t += step_s
    return times, values


def plot(path: Path, runs: Sequence[RunOutcome], order: Sequence[str], title: str) -> None:
    """PNG: one panel per policy (its first repeat), each job's GPU busy fraction over time."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(f"cannot draw {path}: matplotlib is not installed; "
                              "pip install 'adloader[plot]' (./install.sh installs it)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = {}
    for run in runs:
        first.setdefault(run.policy, run)
    panels = [first[p] for p in order if p in first]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 * len(panels) + 0.8), sharex=True, squeeze=False)
    names = sorted({o.spec.name for run in panels for o in run.jobs})
    colours = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}
    for ax, run in zip(axes[:, 0], panels):
        score = score_run(run)
        for outcome in run.jobs:
            timeline = outcome.timeline or {}
            offset = float(timeline.get("loop_start", run.started_at)) - run.started_at
            xs, ys = busy_series(timeline, offset)
            ax.plot(xs, ys, color=colours[outcome.spec.name], linewidth=1.2,
                    label=f"{outcome.spec.name} ({outcome.spec.gpus} GPU)")
        ax.set_ylim(-0.02, 1.05)
        ax.set_ylabel("GPU busy")
        ax.set_title(f"{run.policy} (first run): GPU-weighted busy {score['gpu_busy']:.2f}, "
                     f"makespan {score['makespan_s']:.0f}s", fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="lower right", ncol=2)
    axes[-1, 0].set_xlabel("seconds since the first arrival")
    fig.suptitle(f"{LABEL}: {title}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
