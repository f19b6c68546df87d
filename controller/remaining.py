"""A job's length, learnt from this node's history, for ``jct`` to rank by (A-SRPT).

Reads the completed runs of the job history (controller/history.py) and fits the remaining-
length forests of throughput_model/lengths.py on them (absolute lengths; fractions of the
declared length), again only once the history has grown by ``REFIT_AFTER`` runs. ``python -m
controller.remaining`` prints the forests' error leaving each job's own runs out: on this
node's history (``--history``), or on a generated recurring history (``--generated``).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Mapping, Sequence

from controller.history import FinishedJob, JobHistory
from throughput_model.lengths import (
    LengthForest, LengthPrediction, LengthRecord, fitted_forests, leave_own_out_error, recurring_history,
)

log = logging.getLogger(__name__)

REFIT_AFTER = 10
"""Completed runs the history must gain before the forest is fitted again."""


def length_records(runs: Sequence[FinishedJob]) -> list[LengthRecord]:
    """The history's completed runs as the forest learns from them."""
    return [LengthRecord(name=run.name, gpus=run.gpus, samples=float(run.samples), batch_size=run.batch_size,
                         features=run.features or {}, declared=run.declared_samples)
            for run in runs if run.completed]


class LearntLengths:
    """Predicted lengths from a job history; None where it cannot tell (too few runs of the kind:
    declaring a length, or any)."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history
        self._forests: dict[bool, LengthForest] = {}
        self._fitted_on = -REFIT_AFTER

    def predict(self, name: str, gpus: int, features: Mapping[str, float] | None,
                batch_size: int | None = None, declared: float | None = None) -> LengthPrediction | None:
        job = LengthRecord(name=name, gpus=gpus, batch_size=batch_size, features=features or {}, declared=declared)
        forest = self._current().get(job.declares)
        return forest.predict(job) if forest is not None else None

    def _current(self) -> dict[bool, LengthForest]:
        runs = self.history.completed_runs()
        if len(runs) >= self._fitted_on + REFIT_AFTER or (len(self._forests) < 2 and len(runs) > self._fitted_on):
            self._fitted_on = len(runs)
            self._forests = fitted_forests(length_records(runs))
        return self._forests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controller.remaining", description=(
        "The remaining-length forest's error, each job predicted without any run of its own"))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--history", type=Path, metavar="FILE", help="a node's job history (<state-dir>/history.sqlite)")
    source.add_argument("--generated", action="store_true", help="a generated history of recurring jobs")
    parser.add_argument("--seed", type=int, default=0, help="the generated history's seed (default 0)")
    args = parser.parse_args(argv)
    if args.history is not None:
        if not args.history.exists():
            parser.error(f"no history at {args.history}: give the controller's <state-dir>/history.sqlite")
        records, where = length_records(JobHistory(args.history).completed_runs()), str(args.history)
    else:
        records, where = recurring_history(args.seed), f"generated recurring history (seed {args.seed})"
    figures = leave_own_out_error(records)
    if not figures.get("runs"):
        print(f"{where}: too few completed runs of other jobs to predict any job ({len(records)} runs)")
        return 1
    print(f"{where}: {len(records)} completed runs of {len({r.name for r in records})} jobs, each job predicted "
          f"without its own runs ({figures['runs']:.0f} predictions):")
    print(f"  median error {100 * figures['median_error']:.0f}%, 90th percentile {100 * figures['p90_error']:.0f}%; "
          f"truth within the interval {100 * figures['in_interval']:.0f}%; uncertain {100 * figures['uncertain']:.0f}% "
          f"(ranked by the interval's long end); ranked length not below the truth "
          f"{100 * figures['ranked_not_short']:.0f}%")
    if figures.get("declaring_runs"):
        print(f"  the {figures['declaring_runs']:.0f} runs that declared a length: the forest's median error "
              f"{100 * figures['declaring_median_error']:.0f}%, 90th percentile {100 * figures['declaring_p90_error']:.0f}%; "
              f"the declared length as it is: {100 * figures['declared_median_error']:.0f}%, "
              f"{100 * figures['declared_p90_error']:.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
