"""Unchanged training programs under ``adloader run`` against the same programs run plainly.

    python -m bench.unchanged_programs --out bench/results/unchanged_programs.json

The four programs of tests/programs/ are what users write and never change for adloader: a
Hugging Face ``Trainer`` job, an Accelerate loop, Lightning DDP (2 processes over gloo) and a
``torchrun --nproc-per-node 2`` DDP script over a folder of JPEG files. Each runs with its own
worker count both ways: plainly (python / torchrun) and under ``adloader run`` against a real
controller with the ``static`` policy, which keeps the job managed (its loaders are adloader's
and report) but changes no worker count and sets no CPU limit. So the two differ only by what
adloader adds to a job: the start-up hook, its loader, the reports. Runs alternate, plain then
adloader, per program and repeat, so a drift of the machine falls on both.

Throughput is the training loop's (each program's own record, training_record.py): samples of
all ranks over the longest rank's loop time, start-up excluded. The document gives, per
program, each run's samples/s and the median of the repeats' ratios (adloader / plain); the
goal is >= 0.98. Both runs of a repeat must train on the same samples with the same losses.
Run it with nothing else on the machine. It runs from a checkout (the programs are in tests/).

The program table here (:data:`PROGRAMS`, :func:`command`) is also what tests/test_unchanged_programs.py
runs, so the benchmark and the test start the same commands.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from adloader.errors import AdloaderError
from bench import machine
from bench.controller_process import NO_CGROUP_V1, REPO, Cleanup, ControllerProcess, base_environment, cgroup_v1_usable
from bench.datasets import make_jpeg_cache
from bench.report import write_json

log = logging.getLogger(__name__)

PROGRAM_DIR = REPO / "tests" / "programs"
OURS = "adloader.dataloader.loader.DataLoader"
TORCHS = "torch.utils.data.dataloader.DataLoader"
GOAL = 0.98


class BenchmarkError(AdloaderError):
    """A run failed or did not measure what it must (its output says why)."""


@dataclass(frozen=True)
class Program:
    """One unchanged training program of tests/programs/."""

    name: str
    script: str
    ranks: int
    framework: str
    """The module it needs (a test skips where it is not installed)."""
    torchrun: bool = False
    """Started by ``torchrun --standalone --nproc-per-node RANKS`` (else by python; Lightning starts
    its own second rank)."""
    images: bool = False
    """It trains over a folder of JPEG files (``--data``)."""
    bench_samples: int = 2048
    """Samples an epoch in the benchmark: a few seconds of training on 2 idle cores, so that the
    workers' start at each epoch weighs as in a real run, not the whole measurement."""


PROGRAMS: dict[str, Program] = {p.name: p for p in (
    Program("hf_trainer", "hf_trainer.py", ranks=1, framework="transformers"),
    Program("accelerate", "accelerate_loop.py", ranks=1, framework="accelerate", bench_samples=8192),
    Program("lightning_ddp", "lightning_ddp.py", ranks=2, framework="lightning", bench_samples=8192),
    Program("torchrun_jpeg", "torchrun_jpeg.py", ranks=2, framework="PIL", torchrun=True, images=True),
)}


@dataclass(frozen=True)
class Size:
    """How much each run trains: ``samples`` per epoch (JPEG files for the image program, of
    ``px`` x ``px``), ``epochs`` (the most, with a stop file), ``batch_size``, ``num_workers``."""

    samples: int = 128
    epochs: int = 2
    batch_size: int = 8
    num_workers: int = 2
    px: int = 48


def command(program: Program, out: Path, size: Size, data: Path | None = None, stop_file: Path | None = None
            ) -> list[str]:
    """The program's command line, as a user starts it (``adloader run --`` goes in front for a
    managed run). ``data``: the JPEG folder, for an image program; ``stop_file``: end at the first
    epoch end where it exists (``size.epochs`` is then the most)."""
    script = str(PROGRAM_DIR / program.script)
    launcher = [sys.executable]
    if program.torchrun:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={program.ranks}"]
    args = ["--out", str(out), "--epochs", str(size.epochs), "--batch-size", str(size.batch_size),
            "--num-workers", str(size.num_workers)]
    if program.images:
        if data is None:
            raise BenchmarkError(f"{program.name} trains over JPEG files: give it a folder (make_jpeg_cache)")
        args += ["--data", str(data), "--px", str(size.px)]
    else:
        args += ["--samples", str(size.samples)]
    if stop_file is not None:
        args += ["--stop-file", str(stop_file)]
    return [*launcher, script, *args]


def environment() -> dict[str, str]:
    """The programs' environment, plain or managed: the harness's (bench.controller_process), with
    Hugging Face's libraries offline, so that nothing is ever downloaded (a try raises at once)."""
    return base_environment(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def jpeg_folder(root: Path, size: Size) -> Path:
    """``size.samples`` JPEG files (made once under ``root``) for the image program."""
    return make_jpeg_cache(root, px=size.px * 2, count=size.samples)


def read_records(out: Path, ranks: int) -> list[dict[str, Any]]:
    """The ``rank<R>.json`` records a run wrote, by rank."""
    missing = [r for r in range(ranks) if not (out / f"rank{r}.json").exists()]
    if missing:
        raise BenchmarkError(f"no record from rank(s) {missing} under {out}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def throughput(records: Sequence[dict[str, Any]]) -> float:
    """Samples/s of the training loop: every rank's samples over the longest rank's loop time."""
    wall = max(r["wall_s"] for r in records)
    if wall <= 0:
        raise BenchmarkError("a run's training loop took no time: train more samples (--samples, --epochs)")
    return sum(r["samples"] for r in records) / wall


def run_plain(program: Program, out: Path, size: Size, data: Path | None, timeout: float) -> list[dict[str, Any]]:
    """Run the program as its user would without adloader; its records."""
    argv = command(program, out, size, data)
    result = subprocess.run(argv, env=environment(), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise BenchmarkError(f"{program.name} (plain) exited with {result.returncode}:\n{result.stderr[-3000:]}")
    return read_records(out, program.ranks)


def run_managed(controller: ControllerProcess, program: Program, out: Path, size: Size, data: Path | None,
                timeout: float, options: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Run the program under ``adloader run [options] --`` against ``controller``; its records."""
    job = controller.run(*command(program, out, size, data), name=program.name, environ=environment(),
                         options=options)
    code = job.wait(timeout)
    if code != 0:
        raise BenchmarkError(f"{program.name} (adloader run) exited with {code}:\n{job.output()[1][-3000:]}")
    return read_records(out, program.ranks)


def same_training(plain: Sequence[dict[str, Any]], managed: Sequence[dict[str, Any]]) -> bool:
    """Whether both runs trained on the same samples, in the same order, with the same losses."""
    return all(p["epochs"] == m["epochs"] and p["losses"] == m["losses"] for p, m in zip(plain, managed))


def measure(program: Program, controller: ControllerProcess, work: Path, size: Size, repeats: int,
            timeout: float, launcher_only: bool = False) -> dict[str, Any]:
    """``repeats`` pairs of runs, plain then adloader; per-run samples/s and the ratios. With
    ``launcher_only``, each repeat also runs ``adloader run --no-substitute`` (managed placement,
    torch's loader), which tells the launcher's and cgroup's share of a gap from the loader's."""
    data = jpeg_folder(work / "jpeg", size) if program.images else None
    plain_sps, managed_sps, launcher_sps, same = [], [], [], []
    for repeat in range(repeats):
        plain = run_plain(program, work / f"{program.name}-{repeat}-plain", size, data, timeout)
        managed = run_managed(controller, program, work / f"{program.name}-{repeat}-adloader", size, data, timeout)
        if launcher_only:
            launcher_sps.append(throughput(run_managed(controller, program, work / f"{program.name}-{repeat}-launcher",
                                                       size, data, timeout, options=("--no-substitute",))))
        classes = {r["loader_class"] for r in plain}, {r["loader_class"] for r in managed}
        if classes != ({TORCHS}, {OURS}):
            raise BenchmarkError(f"{program.name}: plain runs loaded through {classes[0]}, managed runs through "
                                 f"{classes[1]}; expected {TORCHS} and {OURS}")
        plain_sps.append(throughput(plain))
        managed_sps.append(throughput(managed))
        same.append(same_training(plain, managed))
        log.info("%s repeat %d: plain %.1f samples/s, adloader %.1f samples/s", program.name, repeat,
                 plain_sps[-1], managed_sps[-1])
    ratios = [m / p for m, p in zip(managed_sps, plain_sps)]
    median = statistics.median(ratios)
    result = {"ranks": program.ranks, "plain_sps": plain_sps, "adloader_sps": managed_sps, "ratios": ratios,
              "ratio_median": median, "meets_goal": median >= GOAL, "same_training": all(same)}
    if launcher_only:
        result["launcher_only_sps"] = launcher_sps
        result["launcher_only_ratio_median"] = statistics.median(m / p for m, p in zip(launcher_sps, plain_sps))
    return result


def table(results: dict[str, dict[str, Any]]) -> str:
    """The results as a text table: median samples/s each way, the median ratio, whether the
    runs trained alike (and the --no-substitute ratio where measured)."""
    launcher = any("launcher_only_ratio_median" in r for r in results.values())
    head = f"{'program':<15} {'plain samples/s':>16} {'adloader samples/s':>19} {'ratio (median)':>15}  same training"
    lines = [head + ("  --no-substitute ratio" if launcher else ""), "-" * (len(head) + (23 if launcher else 0))]
    for name, r in results.items():
        plain, ours = statistics.median(r["plain_sps"]), statistics.median(r["adloader_sps"])
        line = (f"{name:<15} {plain:>16.1f} {ours:>19.1f} {r['ratio_median']:>14.3f}{' ' if r['meets_goal'] else '*'}"
                f"  {'yes' if r['same_training'] else 'NO':<13}")
        if "launcher_only_ratio_median" in r:
            line += f"  {r['launcher_only_ratio_median']:>21.3f}"
        lines.append(line)
    lines.append(f"ratio goal >= {GOAL} (* below it); each program with its own workers both ways, static policy")
    return "\n".join(lines)


def installed(program: Program) -> bool:
    return importlib.util.find_spec(program.framework) is not None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unchanged_programs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    parser.add_argument("--programs", default=",".join(PROGRAMS),
                        help=f"comma-separated subset of {','.join(PROGRAMS)}")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per program (default 3)")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per epoch, JPEG files for torchrun_jpeg (default: each program's, "
                        f"{', '.join(f'{p.name} {p.bench_samples}' for p in PROGRAMS.values())})")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2, help="each program's own workers, both ways")
    parser.add_argument("--px", type=int, default=64, help="side torchrun_jpeg resizes its images to")
    parser.add_argument("--launcher-only", action="store_true",
                        help="also run each program under adloader run --no-substitute (a diagnosis of a gap)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--work-dir", type=Path, default=None, help="where records and images go (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = [n for n in args.programs.split(",") if n]
    unknown = sorted(set(names) - set(PROGRAMS))
    if unknown:
        parser.error(f"unknown program(s) {unknown}: choose from {','.join(PROGRAMS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not PROGRAM_DIR.is_dir():
        parser.error(f"the programs are not at {PROGRAM_DIR}: run it from a checkout of the repository")
    if not cgroup_v1_usable():
        parser.error(f"the benchmark starts a real controller, which {NO_CGROUP_V1}")
    missing = [n for n in names if not installed(PROGRAMS[n])]
    if missing:
        parser.error(f"{missing} need(s) frameworks that are not installed: ./install.sh --test installs them")
    size = Size(epochs=args.epochs, batch_size=args.batch_size, num_workers=args.num_workers,
                px=args.px)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="adl-unchanged-"))
    cleanup = Cleanup()
    started, load = time.time(), os.getloadavg()[0]
    try:
        controller = cleanup.new_controller(("--policy", "static"), 1.0, base_environment()).start()
        results = {name: measure(PROGRAMS[name], controller, work,
                                 replace(size, samples=args.samples or PROGRAMS[name].bench_samples), args.repeats,
                                 args.timeout, args.launcher_only)
                   for name in names}
    finally:
        cleanup.run()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    document = {
        "command": "python -m bench.unchanged_programs " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine.describe() | {"load_average_1m_at_start": load},
        "wall_s": round(time.time() - started, 1),
        "size": size.__dict__ | {"samples": {n: args.samples or PROGRAMS[n].bench_samples for n in names}},
        "repeats": args.repeats, "policy": "static", "goal_ratio": GOAL,
        "programs": results,
    }
    if args.out is not None:
        write_json(args.out, document)
    return 0 if all(r["same_training"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
