"""Benchmark: adloader.DataLoader against torch.utils.data.DataLoader, measured in one run.

    python -m bench.loader [--quick] [--json bench/results/loader.json]

Pure loading, no training step: the loop only takes batches. Every comparison
runs torch and ours at the same worker count, interleaved (torch, ours, ours,
torch, ...) so that load from other processes on the machine hits both alike,
and reports the median of the per-pair ratios (ours / torch). Throughput is
also given as CPU milliseconds per sample (training process + workers), which
other load on the machine does not distort:

  * throughput, CPU-heavy: JPEG files on disk (bench/datasets.py), decode +
    random crop + flip + normalise; samples/s after the first batch;
  * throughput, overhead-bound: tiny tensors, where per-batch overhead is all;
  * resize latency (ours only; torch cannot resize): ``set_num_workers(n+1)``
    to the new worker's first batch received by the loader, p50 and p95;
  * memory per worker (USS and PSS from psutil, mid-epoch), and our
    worker-spawning helper's own USS;
  * start latency per multiprocessing context: ``iter()`` to the first batch,
    for ours the resize latency in that context, and a bare process start as
    the baseline (forkserver with torch preloaded).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil
import torch
from torch.utils.data import Dataset

from adloader import DataLoader
from bench import machine
from bench.datasets import JpegFolder, make_jpeg_cache

CACHE = Path(__file__).resolve().parent / "cache"


@dataclass(frozen=True)
class Config:
    repeats: int
    jpeg_images: int
    jpeg_px: int
    jpeg_batch: int
    tiny_samples: int
    tiny_batch: int
    workers: int
    resizes: int
    contexts: tuple[str, ...]


QUICK = Config(repeats=3, jpeg_images=384, jpeg_px=224, jpeg_batch=32, tiny_samples=8000, tiny_batch=16, workers=2,
               resizes=8, contexts=("fork", "forkserver"))
FULL = Config(repeats=11, jpeg_images=1024, jpeg_px=256, jpeg_batch=32, tiny_samples=24000, tiny_batch=16, workers=2,
              resizes=25, contexts=("fork", "forkserver", "spawn"))


class Tiny(Dataset):
    """Overhead-bound: a sample is 8 floats and a label."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((8,), float(i)), i


def batch_samples(batch: Any) -> int:
    return len(batch[1])


def steady_throughput(loader: Any) -> float:
    """Samples per second over one epoch, from the first batch on (start-up excluded)."""
    it = iter(loader)
    next(it)
    started, samples = time.perf_counter(), 0
    for batch in it:
        samples += batch_samples(batch)
    elapsed = time.perf_counter() - started
    del it
    return samples / elapsed


def _cpu_seconds() -> float:
    """CPU time of this process and of its reaped descendants (workers, once their epoch is over)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def compare_throughput(make: Callable[[type], Any], repeats: int, samples: int) -> dict[str, Any]:
    """Wall-clock samples/s (what the goal is about; noisy when other work shares the machine) and CPU
    milliseconds per sample, training process plus workers, start-up included (insensitive to that
    noise: on a saturated machine throughput is cores / CPU cost)."""
    runs: dict[str, dict[str, list[float]]] = {"torch": {"sps": [], "cpu": []}, "ours": {"sps": [], "cpu": []}}
    for repeat in range(repeats):
        order = [("torch", torch.utils.data.DataLoader), ("ours", DataLoader)]
        for name, cls in order if repeat % 2 == 0 else order[::-1]:
            cpu_before = _cpu_seconds()
            loader = make(cls)
            runs[name]["sps"].append(steady_throughput(loader))
            if isinstance(loader, DataLoader):
                loader.close()
            runs[name]["cpu"].append((_cpu_seconds() - cpu_before) * 1000 / samples)
    ratios = [o / t for o, t in zip(runs["ours"]["sps"], runs["torch"]["sps"])]
    cpu_ratios = [t / o for o, t in zip(runs["ours"]["cpu"], runs["torch"]["cpu"])]
    return {"torch_samples_per_s": runs["torch"]["sps"], "ours_samples_per_s": runs["ours"]["sps"], "ratios": ratios,
            "ratio_median": statistics.median(ratios),
            "torch_cpu_ms_per_sample": runs["torch"]["cpu"], "ours_cpu_ms_per_sample": runs["ours"]["cpu"],
            "cpu_efficiency_ratios": cpu_ratios, "cpu_efficiency_ratio_median": statistics.median(cpu_ratios)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def resize_latency(dataset: Dataset, batch_size: int, base: int, resizes: int, context: str | None = None) -> dict:
    """Grow from ``base`` to ``base+1`` workers while batches flow, wait for the new worker's first
    batch, shrink back; ``resizes`` times."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=base, persistent_workers=True,
                        multiprocessing_context=context)
    it = iter(loader)
    next(it)  # the pool is up: what follows measures resizes, not the first start
    for _ in range(resizes):
        before = len(loader.resize_latencies())
        loader.set_num_workers(base + 1)
        deadline = time.monotonic() + 30
        while len(loader.resize_latencies()) == before and time.monotonic() < deadline:
            it = _next_or_restart(loader, it)
        loader.set_num_workers(base)
        while len(loader.worker_pids()) > base and time.monotonic() < deadline:  # the retired one has left
            it = _next_or_restart(loader, it)
    latencies = loader.resize_latencies()
    loader.close()
    return {"p50_s": percentile(latencies, 0.5), "p95_s": percentile(latencies, 0.95), "samples_s": latencies}


def _next_or_restart(loader: DataLoader, it: Any) -> Any:
    try:
        next(it)
        return it
    except StopIteration:
        it = iter(loader)
        next(it)
        return it


def memory_per_worker(make: Callable[[type], Any], repeats: int) -> dict[str, Any]:
    """USS and PSS of each worker process mid-epoch (MiB), torch and ours; ours' spawner helper apart."""
    result: dict[str, Any] = {"torch": [], "ours": [], "ours_spawner_uss_mib": []}
    for repeat in range(repeats):
        for cls in (torch.utils.data.DataLoader, DataLoader):
            loader = make(cls)
            it = iter(loader)
            for _ in range(10):
                next(it)
            if isinstance(loader, DataLoader):
                pids = loader.worker_pids()
                spawner = it.source.spawner_pid()
                result["ours_spawner_uss_mib"].append(psutil.Process(spawner).memory_full_info().uss / 2**20)
            else:
                pids = [p.pid for p in psutil.Process().children()]
            for pid in pids:
                info = psutil.Process(pid).memory_full_info()
                result["torch" if cls is not DataLoader else "ours"].append(
                    {"uss_mib": info.uss / 2**20, "pss_mib": info.pss / 2**20})
            del it
            if isinstance(loader, DataLoader):
                loader.close()
    for key in ("torch", "ours"):
        result[f"{key}_uss_mib_median"] = statistics.median(m["uss_mib"] for m in result[key])
        result[f"{key}_pss_mib_median"] = statistics.median(m["pss_mib"] for m in result[key])
    return result


def _report_started(conn: Any) -> None:
    conn.send(os.getpid())
    conn.close()


def raw_process_start(context: str, count: int = 6) -> dict[str, float]:
    """Baseline: a bare multiprocessing.Process start until it runs Python code (no dataset, no torch
    work), the first and the median of the later ones. forkserver has torch preloaded (see main)."""
    ctx = multiprocessing.get_context(context)
    times = []
    for _ in range(count):
        receive, send = ctx.Pipe(duplex=False)
        started = time.perf_counter()
        process = ctx.Process(target=_report_started, args=(send,))
        process.start()
        receive.recv()
        times.append(time.perf_counter() - started)
        process.join()
    return {"first_s": times[0], "later_p50_s": statistics.median(times[1:])}


def start_latency(config: Config) -> dict[str, Any]:
    """iter() to first batch for torch and ours, per multiprocessing context; ours' resize latency too."""
    result: dict[str, Any] = {}
    dataset = Tiny(4096)
    for context in config.contexts:
        row: dict[str, Any] = {"bare_process": raw_process_start(context)}
        for name, cls in (("torch", torch.utils.data.DataLoader), ("ours", DataLoader)):
            times = []
            for _ in range(max(1, config.repeats // 3)):
                loader = cls(dataset, batch_size=16, num_workers=config.workers,
                             multiprocessing_context=multiprocessing.get_context(context))
                started = time.perf_counter()
                it = iter(loader)
                next(it)
                times.append(time.perf_counter() - started)
                del it
                if isinstance(loader, DataLoader):
                    loader.close()
            row[f"{name}_first_batch_s"] = statistics.median(times)
        row["ours_resize"] = resize_latency(dataset, 16, 1, 5, context=context)
        result[context] = row
    return result


def run(config: Config) -> dict[str, Any]:
    began = time.monotonic()
    jpeg_root = make_jpeg_cache(CACHE, config.jpeg_px, config.jpeg_images)
    jpeg = JpegFolder(jpeg_root)
    tiny = Tiny(config.tiny_samples)
    w = config.workers

    def make_jpeg(cls: type) -> Any:
        return cls(jpeg, batch_size=config.jpeg_batch, shuffle=True, num_workers=w)

    def make_tiny(cls: type) -> Any:
        return cls(tiny, batch_size=config.tiny_batch, shuffle=True, num_workers=w)

    results: dict[str, Any] = {
        "machine": machine.describe() | {"load_average_at_start": os.getloadavg()},
        "config": config.__dict__,
    }
    print(f"JPEG dataset: {len(jpeg)} images of {config.jpeg_px} px at {jpeg_root}", flush=True)
    results["throughput_jpeg"] = compare_throughput(make_jpeg, config.repeats, len(jpeg))
    print_row("throughput, JPEG decode+augment", results["throughput_jpeg"])
    results["throughput_tiny"] = compare_throughput(make_tiny, config.repeats, len(tiny))
    print_row("throughput, tiny tensors", results["throughput_tiny"])
    results["resize_latency_tiny"] = resize_latency(tiny, config.tiny_batch, w, config.resizes)
    results["resize_latency_jpeg"] = resize_latency(jpeg, 8, w, config.resizes)
    for key in ("resize_latency_tiny", "resize_latency_jpeg"):
        r = results[key]
        print(f"{key:<34} p50 {r['p50_s'] * 1000:7.1f} ms   p95 {r['p95_s'] * 1000:7.1f} ms", flush=True)
    results["memory_per_worker_jpeg"] = memory_per_worker(make_jpeg, max(1, config.repeats // 3))
    m = results["memory_per_worker_jpeg"]
    print(f"{'memory per worker (JPEG), MiB':<34} USS torch {m['torch_uss_mib_median']:.1f} ours "
          f"{m['ours_uss_mib_median']:.1f}   PSS torch {m['torch_pss_mib_median']:.1f} ours "
          f"{m['ours_pss_mib_median']:.1f}   spawner USS {statistics.median(m['ours_spawner_uss_mib']):.1f}",
          flush=True)
    results["start_latency"] = start_latency(config)
    for context, row in results["start_latency"].items():
        print(f"{'start, ' + context:<34} first batch torch {row['torch_first_batch_s'] * 1000:7.1f} ms ours "
              f"{row['ours_first_batch_s'] * 1000:7.1f} ms   ours resize p50 {row['ours_resize']['p50_s'] * 1000:6.1f} ms"
              f"   bare process start: first {row['bare_process']['first_s'] * 1000:6.1f} ms, "
              f"later {row['bare_process']['later_p50_s'] * 1000:6.1f} ms", flush=True)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["seconds"] = time.monotonic() - began
    return results


def print_row(name: str, result: dict[str, Any]) -> None:
    print(f"{name:<34} torch {statistics.median(result['torch_samples_per_s']):9.0f} /s   ours "
          f"{statistics.median(result['ours_samples_per_s']):9.0f} /s   ratio {result['ratio_median']:.3f} "
          f"(pairs: {', '.join(f'{r:.2f}' for r in result['ratios'])})   CPU ms/sample torch "
          f"{statistics.median(result['torch_cpu_ms_per_sample']):.3f} ours "
          f"{statistics.median(result['ours_cpu_ms_per_sample']):.3f} (efficiency ratio "
          f"{result['cpu_efficiency_ratio_median']:.3f})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and a smaller dataset (about a minute)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    multiprocessing.set_forkserver_preload(["torch", "adloader.dataloader"])  # the fair forkserver: torch loaded once
    results = run(config)
    results["mode"] = "quick" if args.quick else "full"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
