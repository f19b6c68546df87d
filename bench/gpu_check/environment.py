"""What the GPU check runs on: said in its first line and in ``summary.json``.

A lent machine gets a copy of the working tree, not this machine's Python packages, and
nothing can be installed there (it reaches no network): the check runs with whatever
Python and torch it finds, and says what that is before anything else.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import sys
from datetime import datetime, timezone
from typing import Any

from adloader.errors import AdloaderError


class GpuCheckError(AdloaderError):
    """The GPU check cannot run here (no torch, no CUDA device without --dry-run)."""


def describe(device_name: str, emulated: bool) -> dict[str, Any]:
    """The run's ``device``, ``cpus``, ``torch`` (version and the CUDA it was built with), when
    it ran (UTC) and whether the GPU was ``emulated``."""
    import torch

    return {
        "device": device_name,
        "emulated": emulated,
        "cpus": len(os.sched_getaffinity(0)),
        "cpus_online": os.cpu_count(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        "python": platform.python_version(),
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def found_line() -> str:
    """One line: the torch, CUDA and GPU this Python finds (before any part runs)."""
    import torch

    cuda = torch.version.cuda or "none"
    if torch.cuda.is_available():
        gpu = f"{torch.cuda.device_count()} GPU(s), device 0: {torch.cuda.get_device_name(0)}"
    else:
        gpu = "no CUDA device visible"
    missing = missing_modules()
    lacks = f"; missing: {', '.join(f'{m} ({why})' for m, why in missing.items())}" if missing else ""
    return (f"bench.gpu: python {platform.python_version()} ({sys.executable}), torch {torch.__version__}, "
            f"built for CUDA {cuda}, {gpu}, {len(os.sched_getaffinity(0))} CPUs{lacks}")


NEEDED = {"numpy": "every part", "PIL": "the node benchmark's JPEGs", "scipy": "the node benchmark's policies",
          "sklearn": "the throughput model's fit", "psutil": "the node benchmark", "cgroupspy": "cgroup v1"}
"""Modules the parts import beside torch, and what lacks them where one is missing: that part
fails and says so, the others run."""


def missing_modules() -> dict[str, str]:
    return {name: why for name, why in NEEDED.items() if importlib.util.find_spec(name) is None}


def require_torch() -> None:
    """Fail fast, in one line, where this Python has no torch."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise GpuCheckError(f"bench.gpu needs torch, and {sys.executable} cannot import it ({exc}); run it "
                            "with the Python that has torch (nothing can be installed on a lent machine)") from None
