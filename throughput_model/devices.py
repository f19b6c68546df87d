"""The devices a prediction can be made for: peak FLOP/s, memory and interconnect bandwidth.

GPUs come from a table of vendor peak numbers (dense, no sparsity); they are physical
priors only: nothing was measured on them here, and predictions for them say so.
The CPU is measured on first use (GEMM FLOP/s, memory bandwidth and the cost of one
tiny op, at the current ``torch.get_num_threads()``) and cached in a JSON file, so the
fitted coefficients, which are ratios to these numbers, carry over to the host.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from throughput_model.corpus import cpu_model_name
from throughput_model.errors import UnknownDevice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    """What the roofline needs to know about a device."""

    name: str
    kind: str
    """"cpu" or "gpu"."""
    peak_flops: float
    """FLOP/s for 32-bit floats (FP32, no TF32)."""
    peak_flops_16bit: float
    """FLOP/s for 16-bit floats (BF16, or FP16 where there is no BF16), dense tensor cores."""
    memory_bandwidth: float
    """Bytes/s between memory and the compute units."""
    interconnect_bandwidth: float
    """Bytes/s each device sends in an all-reduce (NVLink or PCIe per direction; memory for the CPU)."""
    op_overhead_s: float
    """Fixed cost of launching one operator."""
    memory_bytes: float
    measured: bool
    """True when the numbers were measured on this host (only the CPU); False: vendor table."""
    threads: int = 0
    """Threads the CPU numbers were measured with (0 for GPUs)."""
    source: str = ""

    def flops_for(self, dtype_bytes: float) -> float:
        """Peak FLOP/s for parameters of ``dtype_bytes`` bytes per element."""
        return self.peak_flops_16bit if dtype_bytes <= 2 else self.peak_flops


_GIB = 1024.0 ** 3
GPUS: dict[str, Device] = {
    "H100": Device("H100", "gpu", 67e12, 989e12, 3.35e12, 450e9, 6e-6, 80 * _GIB, False,
                   source="NVIDIA H100 SXM5 datasheet: FP32 67 TF, BF16 989 TF dense, HBM3 3.35 TB/s, NVLink 900 GB/s"),
    "H200": Device("H200", "gpu", 67e12, 989e12, 4.8e12, 450e9, 6e-6, 141e9, False,
                   source="NVIDIA H200 SXM datasheet: FP32 67 TF, BF16 989 TF dense, HBM3e 4.8 TB/s, NVLink 900 GB/s"),
    "A100": Device("A100", "gpu", 19.5e12, 312e12, 2.039e12, 300e9, 6e-6, 80 * _GIB, False,
                   source="NVIDIA A100 SXM4 80GB datasheet: FP32 19.5 TF, BF16 312 TF, HBM2e 2.04 TB/s, NVLink 600 GB/s"),
    "V100": Device("V100", "gpu", 15.7e12, 125e12, 0.9e12, 150e9, 6e-6, 32 * _GIB, False,
                   source="NVIDIA V100 SXM2 datasheet: FP32 15.7 TF, FP16 tensor 125 TF (no BF16), HBM2 900 GB/s, "
                          "NVLink 300 GB/s"),
    "L4": Device("L4", "gpu", 30.3e12, 121e12, 0.3e12, 32e9, 6e-6, 24 * _GIB, False,
                 source="NVIDIA L4 datasheet: FP32 30.3 TF, BF16 121 TF dense, GDDR6 300 GB/s, PCIe Gen4 x16"),
}


def known_devices() -> list[str]:
    return ["cpu", *GPUS]


def lookup(name: str, *, cpu: Callable[[], Device] | None = None) -> Device:
    """A device by name: "cpu" (measured here), a table key ("H100"), or a CUDA device name
    such as "NVIDIA H100 80GB HBM3" (matched on the model token)."""
    if name.strip().lower() == "cpu":
        return (cpu or measure_cpu)()
    tokens = set(re.split(r"[^a-z0-9]+", name.lower()))
    for key, device in GPUS.items():
        if key.lower() in tokens:
            return device
    raise UnknownDevice(f"no device {name!r} in the table; known: {known_devices()} "
                        "(add a row to throughput_model/devices.py GPUS for a new GPU)")


# ---------------------------------------------------------------- measuring the CPU


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "adloader"


def _best_seconds(run: Callable[[], None], repeats: int, trials: int = 5) -> float:
    """Best (least disturbed) CPU time of this thread for ``repeats`` calls over ``trials`` trials,
    per call. Measured at a fixed thread count, so CPU time of the calling thread is only exact
    at one thread; more threads are timed by the wall clock."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    run()
    best = float("inf")
    for _ in range(trials):
        start = clock()
        for _ in range(repeats):
            run()
        best = min(best, (clock() - start) / repeats)
    return best


def measure_cpu_numbers(threads: int) -> dict[str, float]:
    """GEMM FLOP/s (512^3 fp32 matmul), memory bandwidth (32 MiB add) and one tiny op's cost."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 512
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        gemm = _best_seconds(lambda: torch.mm(a, b, out=c), 4)
        big = 8 * 1024 * 1024
        x, y, z = torch.randn(big), torch.randn(big), torch.empty(big)
        stream = _best_seconds(lambda: torch.add(x, y, out=z), 3)
        s, t, u = torch.randn(8), torch.randn(8), torch.empty(8)
        tiny = _best_seconds(lambda: torch.add(s, t, out=u), 2000)
    finally:
        torch.set_num_threads(previous)
    return {"peak_flops": 2.0 * n ** 3 / gemm, "memory_bandwidth": 3.0 * 4 * big / stream, "op_overhead_s": tiny}


def calibration(threads: int, measure: Callable[[int], dict[str, float]] = measure_cpu_numbers) -> dict[str, Any]:
    """The device's numbers now (``measure``, this CPU's by default), when, and the load average
    then: a long measurement takes several, so that drift shows."""
    return {"at": round(time.time(), 1), "numbers": measure(threads), "loadavg": list(os.getloadavg())}


def median_numbers(calibrations: list[dict[str, Any]]) -> dict[str, float]:
    """Each device number's median over ``calibrations`` (as :func:`calibration` gives them)."""
    return {k: statistics.median(c["numbers"][k] for c in calibrations) for k in calibrations[0]["numbers"]}


def cpu_device(numbers: dict[str, float], threads: int, name: str) -> Device:
    """A CPU :class:`Device` from measured numbers."""
    return Device(
        name="cpu", kind="cpu", peak_flops=numbers["peak_flops"], peak_flops_16bit=numbers["peak_flops"],
        memory_bandwidth=numbers["memory_bandwidth"], interconnect_bandwidth=numbers["memory_bandwidth"] / 2,
        op_overhead_s=numbers["op_overhead_s"], memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        measured=True, threads=threads, source=f"measured on this host: {name}, {threads} thread(s), torch {torch.__version__}",
    )


_measured: dict[tuple[int, str], Device] = {}


def measure_cpu(threads: int | None = None, cache_dir: Path | None = None, refresh: bool = False) -> Device:
    """This host's CPU, measured at first use (about half a second) and cached in memory and in
    ``cache_dir/cpu-<key>.json`` (key: CPU model, threads, torch version)."""
    threads = threads or torch.get_num_threads()
    name = cpu_model_name()
    directory = cache_dir or default_cache_dir()
    memo_key = (threads, str(directory))
    if not refresh and memo_key in _measured:
        return _measured[memo_key]
    key = hashlib.sha1(f"{name}|{threads}|{torch.__version__}".encode()).hexdigest()[:12]
    path = directory / f"cpu-{key}.json"
    device = None
    if not refresh and path.exists():
        try:
            device = Device(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable CPU measurement cache %s (%s); measuring again", path, exc)
    if device is None:
        device = cpu_device(measure_cpu_numbers(threads), threads, name)
        log.info("measured this CPU at %d thread(s): %.1f GFLOP/s, %.1f GB/s, %.2f us per op", threads,
                 device.peak_flops / 1e9, device.memory_bandwidth / 1e9, device.op_overhead_s * 1e6)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(asdict(device), indent=1))
            temporary.replace(path)
        except OSError as exc:
            log.warning("could not cache the CPU measurement in %s (%s); it is measured again next run", path, exc)
    _measured[memo_key] = device
    return device

