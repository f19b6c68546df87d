"""How far the loading cost behind each job's first plan was from what its whole run measured,
read from a node benchmark's run directories (``adloader bench --workdir``, GPU-emulated runs).

A job's first plan rests on its first loading-curve windows; a plan is then held by hysteresis,
so a first curve that is too dear can decide a job's whole run (docs/policies.md, "A first curve
learnt beside the training process's start-up"). Per ``adaptive`` run directory this reads

- the controller's log: when each job registered, when its training process was first moved
  out of its CPU group, and the first DEBUG line "models behind the new allocation" that gives
  the job a model (its M and the cores it needs at M, plan margin included);
- the job history its controller wrote (``state/history.sqlite``): the loading curve of the
  job's whole run (the median of its last 64 windows), as CPU seconds per sample.

The ratio is the first plan's cost per sample over the whole run's, for jobs that do not read
from the disk (a reader's cores follow its reads); it is grouped by how much of the first
plan's window (the registry's 5 s) lay before the training process was moved out.

    python -m bench.first_plans --runs '/tmp/adloader-bench/random-*/adaptive-[01]' [--json F]
"""
from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from controller.history import JobHistory
from controller.policies.shares import PLAN_MARGIN

WINDOW_S = 5.0
"""The registry's window (controller/registry.py): what the first plan's curve read."""
BUCKETS: tuple[tuple[float, float], ...] = ((0.0, 0.01), (0.01, 1.0), (1.0, 2.0), (2.0, float("inf")))
"""Seconds of the first plan's window before the training process was moved out."""

_REGISTERED = re.compile(r"job (j[0-9a-f]+) \((\S+)\) registered")
_MOVED_OUT = re.compile(r"job (j[0-9a-f]+): training process \d+ moved out")
_MODEL = re.compile(r"(\S+) w=\S+ M=(\d+)/s needs ([\d.]+) cores")


@dataclass(frozen=True)
class FirstPlan:
    run: str
    job: str
    before_move_s: float
    """Seconds of the first plan's window before the job's training process was moved out."""
    ratio: float
    """The first plan's CPU seconds per sample over the whole run's."""


def _time(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first_plans(run_dir: Path) -> list[FirstPlan]:
    """The first plans of one run directory's non-reading jobs whose rank was moved apart."""
    history = run_dir / "state" / "history.sqlite"
    log_file = run_dir / "controller.log"
    if not (history.is_file() and log_file.is_file()):
        return []
    whole_run = {finished.name: cores / sps for finished in JobHistory(history)
                 for cores, sps in finished.loading_curve[:1] if sps > 0}
    names: dict[str, str] = {}
    registered: dict[str, float] = {}
    moved: dict[str, float] = {}
    first: dict[str, tuple[float, float]] = {}
    for line in log_file.read_text().splitlines():
        if match := _REGISTERED.search(line):
            names[match.group(1)] = match.group(2)
            registered[match.group(2)] = _time(line)
        elif (match := _MOVED_OUT.search(line)) and match.group(1) in names:
            moved.setdefault(names[match.group(1)], _time(line))
        elif "models behind the new allocation" in line:
            for model in _MODEL.finditer(line):
                name, m, needs = model.group(1), float(model.group(2)), float(model.group(3))
                if name not in first and m > 0:
                    first[name] = (_time(line), needs / m / PLAN_MARGIN)
    plans = []
    for name, (at, cost) in first.items():
        if name in whole_run and name in moved and name in registered and not name.endswith("-io"):
            before = max(0.0, moved[name] - max(registered[name], at - WINDOW_S))
            plans.append(FirstPlan(run=str(run_dir), job=name, before_move_s=before, ratio=cost / whole_run[name]))
    return plans


def summary(plans: Sequence[FirstPlan]) -> list[dict]:
    """Per bucket of BUCKETS, and over all: how many first plans, and their ratios' quartiles."""
    rows = []
    for label, (low, high) in [(f"[{lo:g}, {hi:g}) s", (lo, hi)) for lo, hi in BUCKETS] + [("all", (0.0, float("inf")))]:
        ratios = sorted(p.ratio for p in plans if low <= p.before_move_s < high)
        if not ratios:
            continue
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        rows.append({"before_move": label, "plans": len(ratios), "q1": quartiles[0], "median": quartiles[1],
                     "q3": quartiles[2], "max": ratios[-1]})
    return rows


def table(rows: Iterable[dict]) -> str:
    lines = ["first plan's cost per sample / the whole run's (GPU-emulated node runs)",
             f"{'window before the move':>24} {'plans':>6} {'q1':>6} {'median':>7} {'q3':>6} {'max':>6}"]
    for row in rows:
        lines.append(f"{row['before_move']:>24} {row['plans']:>6} {row['q1']:>6.2f} {row['median']:>7.2f} "
                     f"{row['q3']:>6.2f} {row['max']:>6.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_plans", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="glob of adaptive run directories")
    parser.add_argument("--json", type=Path, default=None, help="also write the plans and the summary here")
    args = parser.parse_args(argv)
    directories = sorted(Path(p) for p in glob.glob(args.runs))
    plans = [plan for directory in directories for plan in first_plans(directory)]
    if not plans:
        print(f"no first plan found under {args.runs!r}: point --runs at adaptive run directories "
              "that hold controller.log (at DEBUG) and state/history.sqlite", file=sys.stderr)
        return 1
    rows = summary(plans)
    print(table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": args.runs, "directories": len(directories), "summary": rows,
                                         "plans": [asdict(p) for p in plans]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
