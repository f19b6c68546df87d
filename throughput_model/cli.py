"""``adloader model``: profile the zoo, fit the regressor, evaluate it held-out, predict.

    adloader model profile [--quick] [--out FILE]      measure real training steps here
    adloader model fit [--corpus FILE]                 fit and show the coefficients
    adloader model evaluate [--corpus FILE] [--json F] leave-one-family-out table
    adloader model predict (--zoo NAME | --model-file F.py) [--batch N] [--gpus G] [--device D]

Heavy imports (torch) happen inside the subcommands, so ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_PROFILE_OUT = Path("adloader-corpus.json")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    prof = sub.add_parser("profile", help="measure real training step times of the zoo on this device")
    prof.add_argument("--quick", action="store_true", help="a small subset (2 architectures x 2 batches per family)")
    prof.add_argument("--families", nargs="*", help="only these families")
    prof.add_argument("--steps", type=int, help="timed steps per point (default 30, 8 with --quick)")
    prof.add_argument("--threads", type=int, default=1, help="torch threads while profiling (default 1)")
    prof.add_argument("--out", type=Path, default=DEFAULT_PROFILE_OUT,
                      help=f"corpus file to write (JSON; default {DEFAULT_PROFILE_OUT})")
    prof.add_argument("--refresh-features", type=Path, metavar="CORPUS",
                      help="measure nothing: recount the features of CORPUS's points (after a change to the "
                           "counting) and write it to --out")

    fit = sub.add_parser("fit", help="fit the regressor on a corpus and show its coefficients")
    fit.add_argument("--corpus", type=Path, help="corpus JSON (default: the shipped one)")

    ev = sub.add_parser("evaluate", help="leave-one-family-out evaluation against the baselines")
    ev.add_argument("--corpus", type=Path, help="corpus JSON (default: the shipped one)")
    ev.add_argument("--json", type=Path, help="also write the results as JSON here")
    ev.add_argument("--markdown", type=Path, help="also write the table as Markdown here")

    pred = sub.add_parser("predict", help="predict a model's max throughput")
    which = pred.add_mutually_exclusive_group(required=True)
    which.add_argument("--zoo", metavar="NAME", help="a zoo architecture (see --list)")
    which.add_argument("--model-file", type=Path,
                       help="a Python file defining build() -> (model, example_batch[, loss_fn[, optimizer]])")
    which.add_argument("--list", action="store_true", help="list the zoo architectures")
    pred.add_argument("--batch", type=int, help="batch size per GPU (zoo models; default: the zoo's middle one)")
    pred.add_argument("--gpus", type=int, default=1)
    pred.add_argument("--device", default="cpu", help="cpu, H100, H200, A100, V100, L4 or a CUDA device name")
    pred.add_argument("--corpus", type=Path, help="corpus JSON (default: the shipped one)")
    pred.add_argument("--json", action="store_true", help="print the prediction as JSON")


def main(args: argparse.Namespace) -> int:
    from throughput_model.errors import ThroughputModelError

    action = {"profile": _profile, "fit": _fit, "evaluate": _evaluate, "predict": _predict}[args.action]
    try:
        return action(args)
    except ThroughputModelError as exc:
        print(f"adloader model {args.action}: {exc}", file=sys.stderr)
        return 2


def _profile(args: argparse.Namespace) -> int:
    from throughput_model import profile
    from throughput_model.corpus import load_corpus

    if args.refresh_features:
        corpus = profile.refresh_features(load_corpus(args.refresh_features))
        profile.save(corpus, args.out)
        print(f"recounted the features of {len(corpus['points'])} points; wrote {args.out}")
        return 0
    steps = args.steps or (8 if args.quick else 30)
    points = profile.select(args.quick, args.families)
    if not points:
        print(f"no zoo points match families {args.families}", file=sys.stderr)
        return 2
    started = time.time()
    print(f"profiling {len(points)} points at {args.threads} thread(s), {steps} timed steps each "
          "(other work on this machine adds noise: medians are kept)", flush=True)

    def progress(done: int, total: int, record: dict) -> None:
        print(f"[{done:3d}/{total}] {record['model']:<42} batch {record['batch']:4d}  "
              f"step {record['step_s'] * 1e3:8.2f} ms  ({time.time() - started:5.0f} s)", flush=True)

    corpus = profile.profile(points, steps, args.threads, progress)
    profile.save(corpus, args.out)
    print(f"wrote {len(corpus['points'])} points to {args.out} in {corpus['wall_s']:.0f} s; "
          f"fit on it with: adloader model evaluate --corpus {args.out}; a controller predicts from it "
          f"when it is <state-dir>/corpus.json (restart the controller)")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from throughput_model import fit

    started = time.perf_counter()
    model = fit.load_fitted(args.corpus)
    elapsed = time.perf_counter() - started
    print(model.describe())
    print(f"fitted from {model.points} corpus points in {elapsed * 1e3:.0f} ms")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from throughput_model import evaluate
    from throughput_model.corpus import load_corpus

    corpus = load_corpus(args.corpus)
    result = evaluate.evaluate(corpus)
    table = evaluate.markdown(result)
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table + "\n")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from throughput_model import predict, zoo

    if args.list:
        for spec in zoo.ZOO:
            print(f"{spec.name:<44} {spec.family:<8} batches {','.join(map(str, spec.batches))}")
        return 0
    features, label = predict.features_for(zoo_name=args.zoo, model_file=args.model_file, batch=args.batch,
                                           gpus=args.gpus)
    result = predict.predict(features, gpus=args.gpus, device=args.device, corpus=args.corpus)
    if args.json:
        print(json.dumps({"model": label, **result.to_dict()}, indent=1))
    else:
        print(f"{label}: {result.summary()}")
    return 0
