"""What machine a benchmark ran on, said the same way in every result document.

Figures from two machines are not comparable: the same random mixes gained more on a 2-core
AVX2 EPYC VM, whose JPEG decoding is slower, than on the VM before it. So each document names
the CPU's model, how many CPUs the machine has and this process may use, its memory, and the
software; a benchmark adds what only it knows (the CPUs it managed, its load average).
"""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil


def describe(proc: Path = Path("/proc")) -> dict[str, Any]:
    """The machine this process runs on; ``proc``: where /proc is (a fixture tree in tests)."""
    return {
        "cpu_model": cpu_model(proc),
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
    }


def cpu_model(proc: Path = Path("/proc")) -> str:
    """The CPU's model as ``proc``/cpuinfo names it (x86's "model name", some ARM kernels'
    "Model name"), else the processor or architecture Python knows of."""
    try:
        for line in (proc / "cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str | None:
    """An installed distribution's version, without importing it (torch takes seconds to import)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
