"""``python -m bench.ablation``: what each of ``adaptive``'s rules buys, measured by turning it off alone.

Each rule around the linear program was added to fix one case (controller/policies/rules.py).
This runs ``adaptive`` with every rule on, then with each rule off in turn, on the same mixes,
and reports per rule: GPU busy against all rules on (worst and median over the mixes), the
slowest settle after an arrival or departure, and allocation changes per job-minute. A rule
whose removal moves GPU busy by less than ``NO_EFFECT_BUSY`` on every mix, and settle and
changes by no more than ``SETTLE_NOISE_S`` and ``CHANGES_NOISE``, is listed as a candidate
for removal; one without which no mix did worse (but some did better) is listed apart.

``--simulated``: the real policy on the node model (bench/sim_node.py), SIMULATED and
deterministic (the machine's load changes only the wall time). ``--mixes reality`` (default):
the measured 2-core mixes that ``python -m bench.simulate`` checks against reality (the shipped
mixes and the seeded random ones, replayed with what their runs measured), ``--seeds`` each;
``--mixes generated``: the seeded mixes ``bench.simulate`` generates (8-GPU scale, crossing phases,
2-core phase mixes, crossing pairs; ``--per-row`` caps each row's seeds); ``--mixes all``: both
(hours on two cores).

``--node``: ``adloader bench`` (GPU-emulated) on shipped mix files, one run per mix in which
``adaptive`` with every rule and ``adaptive`` with each rule off (policy ``adaptive~RULE``) are
interleaved repeat by repeat, ``--repeats`` each. Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bench import machine
from bench.replay import DISK_BPS, jobs_from_measured_mix, measured_documents, measured_node
from bench.report import write_json
from bench.sim_node import SimJob, SimNode
from bench.simulate import (
    CROSSING_PAIRS, crossing_mix, crossing_pair, run_policy, scale_mix, score, two_core_phase_mix,
)
from controller.policies.rules import RULES, AdaptiveRules

NO_EFFECT_BUSY = 0.005
"""A rule whose removal moves GPU busy by less than this fraction on every mix buys no GPU time."""
SETTLE_NOISE_S = 1.0
"""Settle differences up to one control period are a change a step sooner or later, not an effect."""
CHANGES_NOISE = 0.1
"""Changes per job-minute within this fraction of all rules on (or 0.05 apart) are the same."""
METRICS = ("gpu_busy", "settle_s", "changes_per_job_minute")
"""What is compared per mix: GPU-weighted busy, slowest settle after an arrival or departure,
allocation changes per job-minute."""
MIX_SETS = ("reality", "generated", "all")
NODE_MIXES = ("adloader_like.json", "real_node.json", "periodic_eval.json", "jct_lengths.json",
              "crossing_pair_sharp.json")
"""The shipped 2-core mixes the node ablation runs by default (bench/mixes/)."""
MIXES_DIR = Path(__file__).resolve().parent / "mixes"


@dataclass(frozen=True)
class SimMix:
    """One simulated mix: its name in the report, the node, the jobs and the run's seed."""

    name: str
    node: SimNode
    jobs: tuple[SimJob, ...]
    seed: int


def simulated_mixes(which: str, seeds: int, per_row: int | None = None, period_s: float = 1.0,
                    settle_period_s: float = 0.5) -> list[SimMix]:
    """The mixes of ``which`` (MIX_SETS): ``reality``, each measured mix ``seeds`` times (seeds 0,
    1, ...); ``generated``, the seeded mixes of ``bench.simulate``'s rows (the first ``per_row`` of
    each row; None: as many as it runs) and its crossing pairs; ``all``, both."""
    mixes = []
    if which != "generated":
        for document in measured_documents():
            jobs, node = jobs_from_measured_mix(document)
            mixes += [SimMix(f"{document['mix']['name']}#{seed}", node, tuple(jobs), seed) for seed in range(seeds)]
    if which == "reality":
        return mixes

    def big(cores: int) -> SimNode:
        return SimNode(cores=cores, disk_bps=DISK_BPS, period_s=period_s, settle_period_s=settle_period_s)

    two_cores = measured_node(period_s, settle_period_s)
    generated: list[tuple[str, SimNode, Callable[[int, int, int], list[SimJob]], int, int]] = [
        *((f"scale-{cores}c-{n}", big(cores), scale_mix, n, 3) for cores in (64, 128) for n in (4, 8, 16)),
        *((f"crossing-{cores}c-{n}", big(cores), crossing_mix, n, 3) for cores in (64, 128) for n in (4, 8)),
        *((f"phases-2c-{n}", two_cores, two_core_phase_mix, n, 15) for n in (2, 3, 4)),
    ]
    for label, node, make, n, count in generated:
        mixes += [SimMix(f"{label}-{seed}", node, tuple(make(int(node.cores), n, seed)), seed)
                  for seed in range(1, min(count, per_row or count) + 1)]
    mixes += [SimMix(f"pair-{need:g}-{factor:g}", two_cores, tuple(crossing_pair(need, factor)), 1)
              for need, factor in CROSSING_PAIRS]
    return mixes


def simulated_scores(mix: SimMix, rules: AdaptiveRules) -> dict[str, float]:
    """``adaptive`` under ``rules`` on ``mix``: the METRICS, and the safety net's give-backs."""
    result = score(run_policy("adaptive", mix.node, mix.jobs, mix.seed, rules))
    return {"gpu_busy": result["gpu_busy"], "settle_s": result["settle_s_max"],
            "changes_per_job_minute": result["changes_per_job_minute"],
            "safety_net_reverts": result["safety_net_reverts"]}


def effect(on: Mapping[str, Mapping[str, float]], off: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """What turning a rule off did, over the mixes both ran: GPU busy as a ratio to all rules on
    (worst, median, best, and the mixes it moved by more than :func:`busy_noise`), the slowest settle
    and the median changes per job-minute with and without it; whether that is a candidate for
    removal (no measurable effect), and whether no mix did worse without it (busy, settle, changes)."""
    names = [name for name in on if name in off]
    if not names:
        return {"mixes": 0}
    ratios = {name: off[name]["gpu_busy"] / on[name]["gpu_busy"] for name in names if on[name]["gpu_busy"] > 0}
    moved = sorted((name for name, ratio in ratios.items() if abs(ratio - 1) >= busy_noise(on[name], off[name])),
                   key=lambda name: ratios[name])
    settle = {side: max(runs[name]["settle_s"] for name in names) for side, runs in (("on", on), ("off", off))}
    settle_moved = sorted(name for name in names if abs(off[name]["settle_s"] - on[name]["settle_s"]) > SETTLE_NOISE_S)
    changes = {side: statistics.median(runs[name]["changes_per_job_minute"] for name in names)
               for side, runs in (("on", on), ("off", off))}
    changes_noise = max(0.05, CHANGES_NOISE * changes["on"])
    slower = [name for name in settle_moved if off[name]["settle_s"] > on[name]["settle_s"]]
    return {
        "mixes": len(names),
        "gpu_busy_ratio_worst": min(ratios.values()),
        "gpu_busy_ratio_median": statistics.median(ratios.values()),
        "gpu_busy_ratio_best": max(ratios.values()),
        "mixes_moved": {name: ratios[name] for name in moved},
        "settle_s_slowest": settle,
        "mixes_settle_moved": {name: [on[name]["settle_s"], off[name]["settle_s"]] for name in settle_moved},
        "mixes_settled_slower": len(slower),
        "mixes_settled_faster": len(settle_moved) - len(slower),
        "changes_per_job_minute_median": changes,
        "identical": all(on[name] == off[name] for name in names),
        "candidate_for_removal": not moved and not settle_moved and abs(changes["off"] - changes["on"]) <= changes_noise,
        "never_worse_without": min(ratios.values()) > 1 - NO_EFFECT_BUSY and not slower
        and changes["off"] <= changes["on"] + changes_noise,
    }


def busy_noise(on: Mapping[str, float], off: Mapping[str, float]) -> float:
    """The smallest move of GPU busy that counts as an effect on a mix: NO_EFFECT_BUSY, or, where
    the runs were repeated (the node), the wider of the two arms' spreads over their repeats
    (``gpu_busy_spread``, (max - min) / median): on the node the same code moves 1-3% from one
    repeat to the next, and a move within that is the machine's."""
    return max(NO_EFFECT_BUSY, on.get("gpu_busy_spread", 0.0), off.get("gpu_busy_spread", 0.0))


def arm(rule: str) -> AdaptiveRules:
    """Every rule on but ``rule`` (``a+b``: those together); PolicyError names the rules for an unknown one."""
    return AdaptiveRules().without(rule.split("+"))


def ablate(mixes: Sequence[str], rules: Sequence[str], run: Callable[[str, AdaptiveRules], dict[str, float] | None],
           checkpoint: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """Every mix with all rules on, then each of ``rules`` off alone (``a+b``: those together);
    ``run(mix, rules)`` scores one
    (None: it failed, and the mix is left out of that comparison). ``checkpoint`` gets the
    document after each rule, so an interrupted ablation keeps what it measured."""
    on = {mix: scores for mix in mixes if (scores := run(mix, AdaptiveRules())) is not None}
    document: dict[str, Any] = {"all_on": on, "without": {}}
    for rule in rules:
        off = {mix: scores for mix in on if (scores := run(mix, arm(rule))) is not None}
        document["without"][rule] = {"effect": effect(on, off), "mixes": off}
        checkpoint(document)
    for listed, verdict in (("candidates_for_removal", "candidate_for_removal"),
                            ("never_worse_without", "never_worse_without")):
        document[listed] = [rule for rule, entry in document["without"].items() if entry["effect"].get(verdict)]
    return document


def table(document: Mapping[str, Any], label: str) -> list[str]:
    """The printed summary: one line per rule."""
    lines = [f"{label}: adaptive with each rule off, against all rules on ({len(document['all_on'])} mixes)",
             f"{'rule off':<24} {'busy worst':>10} {'median':>7} {'best':>7} {'moved':>5} {'settle on->off':>15} "
             f"{'slower/faster':>13} {'chg/job-min on->off':>19}  verdict"]
    for rule, entry in document["without"].items():
        e = entry["effect"]
        if not e.get("mixes"):
            lines.append(f"{rule:<24} (no mix ran)")
            continue
        settle, changes = e["settle_s_slowest"], e["changes_per_job_minute_median"]
        lines.append(f"{rule:<24} {e['gpu_busy_ratio_worst']:>9.3f}x {e['gpu_busy_ratio_median']:>6.3f}x "
                     f"{e['gpu_busy_ratio_best']:>6.3f}x "
                     f"{len(e['mixes_moved']):>5} {settle['on']:>6.1f} -> {settle['off']:>4.1f}s "
                     f"{e['mixes_settled_slower']:>6}/{e['mixes_settled_faster']:<6} {changes['on']:>8.2f} -> "
                     f"{changes['off']:>5.2f}  "
                     f"{verdict_of(e)}")
    lines.append(f"moved: mixes whose GPU busy moved by {100 * NO_EFFECT_BUSY:g}% or more, and on the node by more than "
                 f"the spread of either arm's repeats; slower/faster: whose slowest "
                 f"settle after an arrival or departure moved by more than {SETTLE_NOISE_S:g} s")
    return lines


def verdict_of(effect: Mapping[str, Any]) -> str:
    """In words: what turning the rule off did."""
    if effect["identical"]:
        return "no effect (identical runs)"
    if effect["candidate_for_removal"]:
        return "no measurable effect"
    if effect["never_worse_without"]:
        return "never worse without it"
    return "worse without it on some mix"


# ---------------------------------------------------------------------------------------- node

def arm_policy(rules: AdaptiveRules) -> str:
    """The ``adloader bench`` policy that runs ``adaptive`` with ``rules`` (bench.runner.split_variant)."""
    return "adaptive~" + "+".join(rules.off) if rules.off else "adaptive"


def node_command(mix: Path, arms: Sequence[AdaptiveRules], repeats: int, out: Path, extra: Sequence[str] = (),
                 also: Sequence[str] = ()) -> list[str]:
    """One ``adloader bench`` run of ``mix``: ``adaptive`` with every rule, then ``also`` (other
    policies to compare in the same runs), then with each of ``arms``' rules off, interleaved
    repeat by repeat (A B C A B C), so that the machine's drift over the run falls on every arm alike."""
    policies = ",".join(["adaptive", *also, *(arm_policy(rules) for rules in arms)])
    return [sys.executable, "-m", "adloader", "bench", "--mix", str(mix), "--policies", policies,
            "--repeats", str(repeats), "--json", str(out), *extra]


def node_runner(mixes: Mapping[str, Path], arms: Sequence[AdaptiveRules], repeats: int, workdir: Path,
                extra: Sequence[str] = (), also: Sequence[str] = (), reuse: bool = False
                ) -> tuple[Callable[[str, AdaptiveRules], dict[str, float] | None], dict[str, dict[str, Any] | None]]:
    """Scores (mix, rules) from one interleaved ``adloader bench`` run per mix (:func:`node_command`,
    made at the mix's first score): the arm's medians over the repeats and the spread of its GPU
    busy; None when the run failed (its output is kept in ``workdir``). ``reuse``: a mix whose
    run's JSON is in ``workdir`` with every policy asked for is read, not run again (an
    interrupted ablation goes on where it stopped). Also returns each mix's policies as run."""
    workdir.mkdir(parents=True, exist_ok=True)
    documents: dict[str, dict[str, Any] | None] = {}
    wanted = {"adaptive", *also, *(arm_policy(rules) for rules in arms)}

    def bench(name: str) -> dict[str, Any] | None:
        out = workdir / f"{Path(name).stem}.json"
        if reuse and out.exists():
            policies = json.loads(out.read_text())["policies"]
            if wanted <= set(policies):
                print(f"  {name}: reusing {out}", flush=True)
                return policies
        command = node_command(mixes[name], arms, repeats, out, extra, also)
        print("$", " ".join(command), flush=True)
        with open(workdir / f"{Path(name).stem}.log", "w") as log:
            finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
        if finished.returncode != 0 or not out.exists():
            print(f"  failed (exit {finished.returncode}): {log.name}", flush=True)
            return None
        return json.loads(out.read_text())["policies"]

    def run(name: str, rules: AdaptiveRules) -> dict[str, float] | None:
        if name not in documents:
            documents[name] = bench(name)
        policies = documents[name]
        if policies is None:
            return None
        scores = policies[arm_policy(rules)]
        busy = [repeat["gpu_busy"] for repeat in scores.get("repeats", ())]
        spread = (max(busy) - min(busy)) / statistics.median(busy) if len(busy) > 1 and statistics.median(busy) > 0 else 0.0
        return {**{metric: scores[metric] for metric in METRICS}, "gpu_busy_spread": spread}

    return run, documents


def compared(documents: Mapping[str, Mapping[str, Any] | None], also: Sequence[str]) -> dict[str, Any]:
    """Each of ``also`` against ``adaptive`` in the same runs, per mix: GPU busy, mean JCT and
    makespan (medians over the repeats) and their ratios to adaptive's."""
    figures: dict[str, Any] = {}
    for policy in also:
        per_mix = {}
        for mix, policies in documents.items():
            if policies is None or policy not in policies:
                continue
            mine, base = policies[policy], policies["adaptive"]
            entry = {metric: mine.get(metric) for metric in ("gpu_busy", "mean_jct_s", "makespan_s")}
            entry["vs_adaptive"] = {metric: mine[metric] / base[metric] for metric in entry
                                    if mine.get(metric) and base.get(metric)}
            per_mix[mix] = entry
        figures[policy] = per_mix
    return figures


# ---------------------------------------------------------------------------------------- main

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ablation", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--simulated", action="store_true", help="on the node model (SIMULATED, deterministic)")
    where.add_argument("--node", action="store_true", help="adloader bench on shipped mixes (GPU-emulated)")
    parser.add_argument("--out", type=Path, required=True, help="write the results here (JSON)")
    parser.add_argument("--rules", default=",".join(RULES),
                        help="comma-separated rules to turn off one at a time, a+b for several together "
                        "(default: every rule alone)")
    parser.add_argument("--mixes", default=None,
                        help=f"--simulated: {' or '.join(MIX_SETS)} (default reality); --node: mix files, "
                        f"comma-separated (default bench/mixes/{{{','.join(NODE_MIXES)}}})")
    parser.add_argument("--seeds", type=int, default=3, help="--simulated: seeds per measured mix (default 3)")
    parser.add_argument("--per-row", type=int, default=None,
                        help="--simulated: seeded mixes per row of the generated ones (default: bench.simulate's)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N mixes (to time a run)")
    parser.add_argument("--repeats", type=int, default=2, help="--node: adloader bench repeats per run (default 2)")
    parser.add_argument("--scale", type=float, default=None, help="--node: passed to adloader bench (a dry run)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/adloader-ablation"),
                        help="--node: each run's JSON and output")
    parser.add_argument("--also", default="",
                        help="--node: other policies run in the same interleaved runs and compared with adaptive "
                        "(e.g. jct)")
    parser.add_argument("--reuse", action="store_true",
                        help="--node: read a mix's run from --workdir where it holds every policy asked for")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the simulated controller's give-backs are counted, not logged
    rules = [rule.strip() for rule in args.rules.split(",") if rule.strip()]
    arms = [arm(rule) for rule in rules]  # an unknown rule fails here
    started = time.perf_counter()
    if args.simulated:
        which = args.mixes or "reality"
        if which not in MIX_SETS:
            parser.error(f"--mixes {which}: with --simulated give {' or '.join(MIX_SETS)}")
        by_name = {mix.name: mix for mix in simulated_mixes(which, args.seeds, args.per_row)[:args.limit]}
        label = "SIMULATED"
        header = {"benchmark": "adaptive's rules, each off alone, SIMULATED (bench/sim_node.py drives the real policy)",
                  "simulated": True, "mix_set": which, "seeds": args.seeds, "per_row": args.per_row}

        def run(name: str, rules_on: AdaptiveRules) -> dict[str, float] | None:
            return simulated_scores(by_name[name], rules_on)
    else:
        files = [Path(f) for f in args.mixes.split(",")] if args.mixes else [MIXES_DIR / f for f in NODE_MIXES]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            parser.error(f"no mix file {', '.join(missing)}: shipped ones are in {MIXES_DIR}")
        by_name = {f.name: f for f in files[:args.limit]}
        label = "GPU-emulated"
        header = {"benchmark": "adaptive's rules, each off alone, on the node benchmark (GPU-emulated)",
                  "simulated": False, "repeats": args.repeats, "scale": args.scale}
        also = [policy.strip() for policy in args.also.split(",") if policy.strip()]
        run, runs = node_runner(by_name, arms, args.repeats, args.workdir,
                                ("--scale", str(args.scale)) if args.scale is not None else (), also, args.reuse)
        header["also"] = also
    header |= {"machine": machine.describe(), "rules_off_in_turn": rules,
               "no_effect": {"gpu_busy": NO_EFFECT_BUSY, "settle_s": SETTLE_NOISE_S, "changes": CHANGES_NOISE}}

    def checkpoint(document: dict[str, Any]) -> None:
        write_json(args.out, {**header, **document, "wall_s": time.perf_counter() - started})
        rule = list(document["without"])[-1]
        print(f"  {rule} off: {time.perf_counter() - started:.0f} s", flush=True)

    document = ablate(list(by_name), rules, run, checkpoint)
    if not args.simulated and header["also"]:
        document["also"] = compared(runs, header["also"])
    write_json(args.out, {**header, **document, "wall_s": time.perf_counter() - started})
    for line in table(document, label):
        print(line)
    for policy, per_mix in document.get("also", {}).items():
        for mix, entry in per_mix.items():
            ratios = ", ".join(f"{metric} {ratio:.3f}x" for metric, ratio in entry["vs_adaptive"].items())
            print(f"{policy} against adaptive on {mix}: {ratios}")
    print(f"candidates for removal (no measurable effect): {', '.join(document['candidates_for_removal']) or 'none'}")
    print(f"never worse without: {', '.join(document['never_worse_without']) or 'none'}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
