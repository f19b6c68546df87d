"""Benchmark: how much one architecture's prediction error moves between runs, by how the CPU is calibrated.

    python -m bench.calibration_window [--per-family 3] [--rounds 4] [--corpus F] [--json F]

On a VM that switches speed within seconds, the public set's per-architecture error moved
between two runs of the same code by as much as its goals. This times the first
``--per-family`` architectures of each family of the public set (docs/prediction.md, "Judged on
a public set chosen by rule") ``--rounds`` times, two ways interleaved, the order alternating:

- ``pair``: one calibration right before the timed steps and one right after, predicted with
  their mean (what ``public_eval`` did);
- ``window``: one before every timed step (each followed by an untimed step) and one after the
  last, predicted with each number's median (what ``public_eval`` does).

Reported per way: the spread, the median and p90 of how far an architecture's log error is from
its own mean over the rounds, once each round's common factor (the median over architectures)
is out; and the median and p90 absolute error over all rounds.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.report import write_json

WAYS = ("pair", "window")


def spread(rows: list[dict[str, Any]], way: str) -> dict[str, float]:
    """Median and p90 |deviation| of an architecture's log(measured / predicted) from its mean over
    the rounds, each round's median over architectures taken out first; and the absolute errors'."""
    chosen = [r for r in rows if r["way"] == way]
    logs = {(r["round"], r["model_type"]): math.log(r["step_s"] / r["predicted_step_s"]) for r in chosen}
    rounds = sorted({k for k, _ in logs})
    architectures = sorted({a for _, a in logs})
    common = {k: statistics.median(logs[(k, a)] for a in architectures) for k in rounds}
    deviations = []
    for architecture in architectures:
        own = [logs[(k, architecture)] - common[k] for k in rounds]
        mean = statistics.fmean(own)
        deviations += [abs(v - mean) for v in own]
    absolute = [abs(math.exp(v) - 1) for v in logs.values()]
    return {"n": len(architectures), "rounds": len(rounds),
            "median_deviation": float(np.median(deviations)), "p90_deviation": float(np.quantile(deviations, 0.9)),
            "median_ape": float(np.median(absolute)), "p90_ape": float(np.quantile(absolute, 0.9))}


def run(per_family: int, rounds: int, steps: int, warmup: int, corpus: Path | None,
        families: tuple[str, ...] | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Both ways, ``rounds`` times, on the first ``per_family`` of each family; the JSON document."""
    import torch

    from throughput_model import public_eval
    from throughput_model.corpus import cpu_model_name
    from throughput_model.devices import calibration, cpu_device, median_numbers
    from throughput_model.features import describe
    from throughput_model.fit import load_fitted

    fitted = load_fitted(corpus)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as the corpus was profiled
    started = time.time()
    try:
        chosen = _first_per_family(public_eval, per_family, families)
        described = {c.model_type: describe(model, batch, loss_fn=public_eval.logits_loss,
                                            optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4)).features
                     for c, model, batch in chosen}
        progress(f"{len(chosen)} architectures: {', '.join(c.model_type for c, _, _ in chosen)}")
        calibrate = lambda: calibration(1)  # noqa: E731
        rows = []
        for index in range(rounds):
            for candidate, model, batch in chosen:
                for way in (WAYS if index % 2 == 0 else WAYS[::-1]):
                    if way == "pair":
                        before = calibrate()
                        measured = public_eval.measure(model, batch, steps, warmup)
                        calibrations = [before, calibrate()]
                    else:
                        measured = public_eval.measure(model, batch, steps, warmup, calibrate)
                        calibrations = measured["calibrations"]
                    device = cpu_device(median_numbers(calibrations), 1, cpu_model_name())
                    predicted = fitted.step_seconds(described[candidate.model_type], device)
                    rows.append({"round": index, "model_type": candidate.model_type, "family": candidate.family,
                                 "way": way, "step_s": measured["step_s"], "predicted_step_s": predicted,
                                 "error": measured["step_s"] / predicted - 1, "calibrations": calibrations})
                    progress(f"  round {index + 1} {candidate.model_type:<18} {way:<6} measured "
                             f"{measured['step_s'] * 1e3:7.1f} ms, predicted {predicted * 1e3:7.1f} ms")
    finally:
        torch.set_num_threads(previous)
    return {"benchmark": "an architecture's prediction error between rounds, by calibration (bench/calibration_window.py)",
            "corpus": str(corpus) if corpus else "shipped", "cpu_model": cpu_model_name(), "per_family": per_family,
            "families": list(families) if families else "all",
            "rounds": rounds, "steps": steps, "warmup": warmup, "wall_s": round(time.time() - started, 1),
            "summary": {way: spread(rows, way) for way in WAYS}, "rows": rows}


def _first_per_family(public_eval: Any, per_family: int, families: tuple[str, ...] | None) -> list[tuple[Any, Any, Any]]:
    """The public set's rule walked only as far as ``per_family`` per family: the first that build and train."""
    chosen: list[tuple[Any, Any, Any]] = []
    taken: dict[str, int] = {}
    for candidate in public_eval.candidates(families):
        if taken.get(candidate.family, 0) >= per_family:
            continue
        try:
            model, batch = public_eval.build(candidate)
            public_eval.measure(model, batch, steps=1, warmup=0)
        except Exception:  # the rule's: a candidate that does not build or train is not taken
            continue
        chosen.append((candidate, model, batch))
        taken[candidate.family] = taken.get(candidate.family, 0) + 1
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calibration_window", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-family", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per architecture and way")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--corpus", type=Path, help="zoo corpus to fit on (default: the shipped one)")
    parser.add_argument("--families", help="comma-separated subset of the public set's families (default: all)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    from throughput_model.public_eval import PublicEvalError, parse_families

    try:
        families = parse_families(args.families)
    except PublicEvalError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    result = run(args.per_family, args.rounds, args.steps, args.warmup, args.corpus, families)
    print(f"{'way':<7} {'n':>3} {'rounds':>6} {'median dev':>10} {'p90 dev':>8} {'median err':>10} {'p90 err':>8}")
    for way, s in result["summary"].items():
        print(f"{way:<7} {s['n']:>3} {s['rounds']:>6} {s['median_deviation']:>10.1%} {s['p90_deviation']:>8.1%} "
              f"{s['median_ape']:>10.1%} {s['p90_ape']:>8.1%}")
    pair, window = (result["summary"][w]["median_deviation"] for w in WAYS)
    print(f"window / pair, median deviation: {window / pair:.2f} ({result['wall_s']:.0f} s)")
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
