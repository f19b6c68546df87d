"""``python -m reliability.bench [--quick] [--json FILE]``: faults, bad input and load
against real controllers, counted.

Runs, each on a fresh controller (``--policy even``, real cgroup v1 groups, real jobs
under ``adloader run``), the scenarios the reliability tests run, longer:
  * faults: SIGKILL at every named fault point (several rounds), SIGKILL at random
    moments of a churning run, jobs dying in every way, the controller going away
    (SIGKILL and SIGTERM) under a job loading through adloader.DataLoader, the
    controller starting on a damaged state file (truncated at every length of a real
    one in the full run, plus bad checksum, edits, a future version, garbage, a
    leftover temp file), and a full or read-only state directory;
  * malformed input: mutated and hypothesis-generated lines and abusive connections;
  * load: 256 reporting clients for a minute (full run), 10,000 connect/disconnect
    cycles and slow clients holding half-written lines.

It prints a table and writes the figures as JSON: faults injected and survived (and
how long a restarted controller took to answer and to be consistent), malformed
messages tried, clients held and their reply latency, and what was lost (goal:
nothing). Needs root and a writable cgroup v1 hierarchy; its controllers and jobs run
through the harness the benchmarks and the end-to-end tests share
(bench/controller_process.py). reliability/ is not in the wheel: run it from a checkout. The full run
takes 10 to 15 minutes on 2 cores (docs/reliability.md has the figures).
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from reliability.faults import (
    FAULT_POINTS, controller_away, crash_at_fault_point, crash_during_churn, dying_jobs, kill_and_resume,
)
from reliability.fuzz import run_fuzz
from reliability.load import raise_fd_limit, run_load, second_round_rss
from reliability.node import JOB_MODULE, Node
from reliability.state import (
    run_on_unwritable_state_dir, saved_state, small_tmpfs, start_on_state, state_variants,
)
from adloader.cpuspec import parse_cpus
from bench.controller_process import NO_CGROUP_V1, Cleanup, base_environment, cgroup_v1_usable, poll
from bench.report import write_json

PERIOD = 0.5
SETTLE_S = 2 * PERIOD + 3.0
MAX_STEP_GAP_S = 5.0


@dataclass(frozen=True)
class Scale:
    plan_restarts: int
    """kill -9 of a controller planning adaptively for two contending jobs, then a restart."""
    fault_point_rounds: int
    random_kills: int
    dying_rounds: int
    truncation_stride: int
    """1: every length of the state file."""
    fuzz_mutations: int
    fuzz_examples: int
    fuzz_sessions: int
    load_jobs: int
    load_connections: int
    load_seconds: float
    cycles: int
    slow_clients: int


FULL = Scale(plan_restarts=10, fault_point_rounds=3, random_kills=30, dying_rounds=3, truncation_stride=1, fuzz_mutations=50_000,
             fuzz_examples=300, fuzz_sessions=400, load_jobs=8, load_connections=32, load_seconds=60.0,
             cycles=10_000, slow_clients=64)
QUICK = Scale(plan_restarts=2, fault_point_rounds=1, random_kills=5, dying_rounds=1, truncation_stride=97, fuzz_mutations=9_600,
              fuzz_examples=40, fuzz_sessions=40, load_jobs=2, load_connections=32, load_seconds=5.0, cycles=1_000,
              slow_clients=16)

LOST_KINDS = {
    "jobs not adopted or lost track of": ("not adopted", "lost track", "dropped while", "no live process"),
    "orphaned groups": ("orphaned group", "has no"),
    "limits not restored": ("limits were not restored", "did not restore", "the even policy gives", "kernel cpuset"),
    "other owner's cgroup touched": ("other owner",),
    "training stopped": ("stalled", "exited with", "did not go on", "did not stop cleanly", "left its last"),
    "controller down or crash-looping": ("did not come back", "did not start", "does not answer", "exited after",
                                         "did not restart"),
    "state file wrong": ("state file", "temp file", "moved aside", "state_corruptions_total", "policy"),
    "messages answered wrongly": ("got ", "expected", "closed without a reply", "counted errors", "node changed"),
    "clients blocked or refused": ("kept waiting", "failures:", "disturbed", "status request failed", "connected"),
    "file descriptors leaked": ("file descriptors",),
}
"""What a violation says it lost, by the words it uses (see the invariants in reliability/node.py)."""


@contextmanager
def fresh_node(cpus: str = "0", tmpfs_state: bool = False, policy: str = "even") -> Iterator[Node]:
    """A new controller (``--policy POLICY --cpus CPUS``) with its own socket, state and group;
    everything it and its jobs leave is removed afterwards."""
    cleanup = Cleanup()
    try:
        controller = cleanup.new_controller(("--policy", policy, "--cpus", cpus), PERIOD, base_environment())
        controller.start()
        count = len(parse_cpus(cpus))
        if tmpfs_state:
            controller.kill()
            with small_tmpfs(controller.state_dir):
                controller.start()
                node = Node(controller, cpus=count, policy=policy)
                try:
                    yield node
                finally:
                    node.close()
                    controller.kill()
        else:
            node = Node(controller, cpus=count, policy=policy)
            try:
                yield node
            finally:
                node.close()
    finally:
        cleanup.run()


def _fault(kind: str, what: str, violations: Sequence[str], **details: Any) -> dict[str, Any]:
    return {"kind": kind, "fault": what, "survived": not violations, "violations": list(violations), **details}


def run_faults(scale: Scale, rng: random.Random, log: Any) -> list[dict[str, Any]]:
    faults: list[dict[str, Any]] = []
    log(f"fault points: {scale.fault_point_rounds} round(s) of {len(FAULT_POINTS)}")
    for _ in range(scale.fault_point_rounds):
        with fresh_node() as node:
            setup = node.start_registered(2)
            for spec in FAULT_POINTS:
                o = crash_at_fault_point(node, spec, SETTLE_S)
                missed = [] if o.crashed else [f"{spec} was never reached"]
                faults.append(_fault("fault point", spec, setup + missed + o.violations, ready_s=o.ready_s,
                                     consistent_s=o.consistent_s, initially=o.initially))
            node.stop_all()
            faults[-1]["violations"] += node.training_stopped(MAX_STEP_GAP_S)
    log(f"kill -9 at random moments of a churning run: {scale.random_kills}")
    with fresh_node() as node:
        setup = node.start_registered(2)
        for o in crash_during_churn(node, scale.random_kills, SETTLE_S, rng):
            faults.append(_fault("kill -9 during churn", o.fault, setup + o.violations, ready_s=o.ready_s,
                                 consistent_s=o.consistent_s, initially=o.initially))
            setup = []
        node.stop_all()
        faults[-1]["violations"] += node.training_stopped(MAX_STEP_GAP_S)
    log(f"dying jobs: {scale.dying_rounds} round(s)")
    for _ in range(scale.dying_rounds):
        with fresh_node() as node:
            setup = node.start_registered(1)
            for o in dying_jobs(node, SETTLE_S):
                faults.append(_fault("job dies", o.fault, setup + o.violations, cleanup_s=o.cleanup_s))
            node.stop_all()
            faults[-1]["violations"] += node.training_stopped(MAX_STEP_GAP_S)
    log("controller away (SIGKILL, SIGTERM) under a DataLoader job")
    for how in ("SIGKILL", "SIGTERM"):
        with fresh_node(cpus="0-1") as node:
            o = controller_away(node, how)
            node.stop_all()
            faults.append(_fault("controller away", o.fault, o.violations + node.training_stopped(MAX_STEP_GAP_S),
                                 reconnect_s=o.reconnect_s, steps_while_away=o.steps_while_away))
    faults += run_state_faults(scale, log)
    for fault in faults:
        fault["survived"] = not fault["violations"]
    return faults


ADAPTIVE_JOBS = (("big", ("--gpus", "4"), ("--step-s", "0.02", "--load-rounds", "3000")),
                 ("small", (), ("--step-s", "0.01", "--load-rounds", "3000")))
"""Two jobs whose loading needs more than the one CPU between them (tests/test_restart_resumes_plan.py)."""


def run_plan_restarts(scale: Scale, log: Any) -> list[dict[str, Any]]:
    """For each restart: the allocation before the kill, at the first step after it, and the
    periods until they match (0: the plan resumed at once)."""
    log(f"kill -9 of an adaptive controller, plan before vs after: {scale.plan_restarts}")
    restarts: list[dict[str, Any]] = []
    with fresh_node(policy="adaptive") as node:
        for name, options, args in ADAPTIVE_JOBS:
            node.controller.run(sys.executable, "-m", JOB_MODULE, "--seconds", "3600", *args, name=name,
                                options=options)
        planned = poll(lambda: (s := node.controller.status()).reallocations_total.get("gain")
                       and len(s.jobs) == len(ADAPTIVE_JOBS), 120)
        if not planned:
            return [{"before": {}, "after": {}, "periods_to_match": None,
                     "violations": ["adaptive never planned from the jobs' models within 120 s"]}]
        for _ in range(scale.plan_restarts):
            time.sleep(4 * PERIOD)  # a few steps on the restarted controller's own measurements
            o = kill_and_resume(node)
            restarts.append({**asdict(o), "violations": [] if o.periods_to_match == 0 else [
                f"the plan resumed after {o.periods_to_match} periods, not at the first step"]})
    return restarts


def run_state_faults(scale: Scale, log: Any) -> list[dict[str, Any]]:
    """The controller starting on damaged state files (two nodes in parallel), then on a
    full and a read-only state directory."""
    with fresh_node() as probe:
        probe.start_registered(1)
        original = saved_state(probe)
    variants = state_variants(original, range(0, len(original), scale.truncation_stride))
    log(f"damaged state files: {len(variants)} starts ({len(original)}-byte file)")
    halves = [variants[0::2], variants[1::2]]

    def start_each(part: list) -> list[dict[str, Any]]:
        out = []
        with fresh_node() as node:
            setup = node.start_registered(1)
            for variant in part:
                o = start_on_state(node, variant, SETTLE_S)
                out.append(_fault("damaged state file", variant.label, setup + o.violations, ready_s=o.ready_s))
                setup = []
            out[-1]["violations"] += node.training_stopped(MAX_STEP_GAP_S)
        return out

    with ThreadPoolExecutor(len(halves)) as pool:
        faults = [f for part in pool.map(start_each, halves) for f in part]
    log("full and read-only state directory")
    for damage in ("full", "read-only"):
        with fresh_node(tmpfs_state=True) as node:
            setup = node.start_registered(1)
            found = run_on_unwritable_state_dir(node, damage, SETTLE_S)
            node.stop_all()
            faults.append(_fault("unwritable state directory", damage,
                                 setup + found + node.training_stopped(MAX_STEP_GAP_S)))
    return faults


def run_malformed(scale: Scale, seed: int) -> dict[str, Any]:
    with fresh_node() as node:
        bystander = node.start_job(name="bystander", report_every=0.1)
        node.wait_registered(bystander)
        report = run_fuzz(node, bystander, scale.fuzz_mutations, scale.fuzz_examples, scale.fuzz_sessions, seed)
    return {**asdict(report), "messages": report.messages}


def run_clients(scale: Scale) -> dict[str, Any]:
    """The load phase runs under ``--policy static`` (no quota): the load jobs' own clients must
    not be throttled by the split, or their CPU quota would show up as reply latency."""
    with fresh_node(cpus="0-1", policy="static") as node:
        report = run_load(node, scale.load_jobs, scale.load_connections, scale.load_seconds, scale.cycles,
                          scale.slow_clients, echo=True)
        _, left = node.wait_consistent(SETTLE_S)
        rss_again = second_round_rss(node, scale.cycles)
    return {**asdict(report), "rss_after_another_round_of_cycles": rss_again, "violations": report.violations + left}


def lost(violations: Sequence[str]) -> dict[str, int]:
    """Violations counted by what they lost (LOST_KINDS); anything unrecognised is "other"."""
    counted: Counter = Counter()
    for text in violations:
        kind = next((k for k, words in LOST_KINDS.items() if any(w in text for w in words)), "other")
        counted[kind] += 1
    return dict(counted)


def summarise(faults: list[dict[str, Any]], malformed: dict[str, Any], load: dict[str, Any]) -> dict[str, Any]:
    by_kind: dict[str, dict[str, Any]] = {}
    for fault in faults:
        entry = by_kind.setdefault(fault["kind"], {"injected": 0, "survived": 0})
        entry["injected"] += 1
        entry["survived"] += fault["survived"]
        if "initially" in fault:  # a restart: did every invariant hold at the first check after it answered?
            entry["consistent_at_first_check"] = entry.get("consistent_at_first_check", 0) + (not fault["initially"])
        for key in ("ready_s", "consistent_s", "cleanup_s", "reconnect_s"):
            if fault.get(key) is not None:
                entry[f"max_{key}"] = round(max(entry.get(f"max_{key}", 0.0), fault[key]), 3)
    violations = [v for f in faults for v in f["violations"]] + malformed["violations"] + load["violations"]
    return {
        "faults_injected": len(faults),
        "faults_survived": sum(f["survived"] for f in faults),
        "faults_by_kind": by_kind,
        "malformed_messages": malformed["messages"],
        "malformed_answered_as_specified": malformed["lines"] if not malformed["violations"] else None,
        "clients": load["clients"],
        "latency_p50_ms": load["latency_p50_ms"],
        "latency_p99_ms": load["latency_p99_ms"],
        "lost": lost(violations),
        "violations": violations,
    }


def print_table(result: dict[str, Any]) -> None:
    s, malformed, load = result["summary"], result["malformed"], result["load"]
    mib = 1024 * 1024
    rows = [("faults injected / survived", f"{s['faults_injected']} / {s['faults_survived']}")]
    for kind, entry in s["faults_by_kind"].items():
        details = [f"{k[4:]} <= {v:.2f}s" for k, v in entry.items() if k.startswith("max_")]
        if "consistent_at_first_check" in entry:
            details.insert(0, f"consistent at the first check: {entry['consistent_at_first_check']}")
        rows.append((f"  {kind}", f"{entry['survived']}/{entry['injected']}" +
                     (f" ({', '.join(details)})" if details else "")))
    rows += [
        ("malformed messages tried", f"{malformed['messages']} ({malformed['lines']} lines, "
                                     f"{malformed['sessions']} abusive connections) in {malformed['seconds']:.0f}s"),
        ("  answered as specified", "all" if not malformed["violations"] else f"NO: {malformed['violations'][:2]}"),
        ("  controller RSS before / after", f"{malformed['rss_before'] / mib:.1f} / {malformed['rss_after'] / mib:.1f} MiB"),
        ("clients held", f"{load['clients']} reporting every 1s for {load['seconds']:.0f}s + {load['slow_clients']} "
                         f"slow (half a line)"),
        ("  reply latency p50 / p99 / max", f"{load['latency_p50_ms']:.2f} / {load['latency_p99_ms']:.2f} / "
                                            f"{load['latency_max_ms']:.2f} ms ({load['replies']} replies)"),
        ("  same reports to a canned-reply server", f"{load['echo_p50_ms']:.2f} / {load['echo_p99_ms']:.2f} ms "
                                                    "p50 / p99 (interleaved: what the machine adds)"),
        ("  blocked clients", str(load["blocked"])),
        ("  connect/disconnect cycles", f"{load['cycles']} ({load['cycles_per_s']:.0f}/s, beside the load)"),
        ("  controller fds baseline / peak / after", f"{load['fds_baseline']} / {load['fds_peak']} / {load['fds_after']}"),
        ("  controller RSS baseline / peak / after", f"{load['rss_baseline'] / mib:.1f} / {load['rss_peak'] / mib:.1f}"
                                                     f" / {load['rss_after'] / mib:.1f} MiB, "
                                                     f"{load['rss_after_another_round_of_cycles'] / mib:.1f} MiB after "
                                                     f"{load['cycles']} more cycles"),
        ("  controller CPU under load", f"{load['controller_cpu_percent']:.1f}% of one core"),
        ("lost", "nothing" if not s["lost"] else ", ".join(f"{k}: {v}" for k, v in s["lost"].items())),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\nadloader reliability ({'quick' if result['quick'] else 'full'} run, {result['duration_s']:.0f}s, "
          f"{result['machine']['cpus']} CPUs)")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short version (1 to 4 minutes)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the figures here")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--restarts-only", action="store_true",
                        help="only the adaptive plan-resumption restarts (a quick check of that section)")
    args = parser.parse_args(argv)
    if not cgroup_v1_usable():
        print(f"reliability.bench: {NO_CGROUP_V1}", file=sys.stderr)
        return 2
    raise_fd_limit()
    scale = QUICK if args.quick else FULL
    started = time.monotonic()

    phases: dict[str, list[float]] = {}

    def log(text: str) -> None:
        phases[text] = [round(x, 2) for x in os.getloadavg()]
        print(f"[{time.monotonic() - started:6.0f}s] {text} (load average {phases[text][0]})", file=sys.stderr,
              flush=True)

    restarts = run_plan_restarts(scale, log)
    if args.restarts_only:
        _print_restarts(restarts)
        return 0 if not any(r["violations"] for r in restarts) else 1
    faults = run_faults(scale, random.Random(args.seed), log)
    log("malformed input")
    malformed = run_malformed(scale, args.seed)
    log("load")
    load = run_clients(scale)
    result = {
        "benchmark": "reliability", "quick": args.quick, "seed": args.seed, "scale": asdict(scale),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_at_phase_start": phases, "load_average_at_end": os.getloadavg()},
        "period_s": PERIOD, "duration_s": round(time.monotonic() - started, 1),
        "summary": summarise(faults, malformed, load), "faults": faults, "malformed": malformed, "load": load,
        "plan_restarts": restarts,
    }
    print_table(result)
    _print_restarts(restarts)
    if args.json is not None:
        write_json(args.json, result)
        log(f"figures written to {args.json}")
    restart_violations = [v for r in restarts for v in r["violations"]]
    return 0 if not result["summary"]["violations"] and not restart_violations else 1


def _print_restarts(restarts: list[dict[str, Any]]) -> None:
    """One line per restart: each job's applied (weight, workers) before -> after, and the
    periods until the plan was back (GPU-emulated jobs)."""
    print("\nadaptive plan across kill -9 + restart (cpu_weight/workers per job, before -> first step after):")
    for i, r in enumerate(restarts, 1):
        jobs = ", ".join(f"{job_id} {b[0]}/{b[2]} -> {r['after'].get(job_id, [None] * 4)[0]}/"
                         f"{r['after'].get(job_id, [None] * 4)[2]}" for job_id, b in r["before"].items())
        print(f"  restart {i}: {jobs}; periods until they match: {r['periods_to_match']}")


if __name__ == "__main__":
    sys.exit(main())
