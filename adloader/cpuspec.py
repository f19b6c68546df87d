"""CPU id lists in the kernel's list format ("0-3,6"), as cpuset.cpus and --cpus use it.

cgroupspy's CommaDashSetFile parses this format too, but it accepts nonsense
silently ("3-1" becomes the empty set, "x" raises a bare ValueError), and an
operator typo in ``--cpus`` must be refused with a message instead.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from adloader.errors import AdloaderError


class CpuSpecError(AdloaderError):
    """A CPU list is not in the kernel's list format or names no CPU."""


def parse_cpus(spec: str) -> tuple[int, ...]:
    """``"0-3,6"`` -> ``(0, 1, 2, 3, 6)``: sorted, without duplicates. Raises CpuSpecError."""
    cpus: set[int] = set()
    text = spec.strip()
    if not text:
        raise CpuSpecError("empty CPU list: give CPU ids like '0-3,6' (see /sys/devices/system/cpu/online)")
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise CpuSpecError(
                f"bad CPU list {spec!r}: {part.strip()!r} is not a CPU id or a range like '2-5'"
            ) from None
        if low < 0 or high < low:
            raise CpuSpecError(f"bad CPU list {spec!r}: range {part.strip()!r} is empty or negative")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpus(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 6)`` -> ``"0-3,6"`` (what the kernel writes back). Raises CpuSpecError if empty."""
    ids = sorted(set(cpus))
    if not ids:
        raise CpuSpecError("empty CPU set: a job must be allowed at least one CPU")
    if ids[0] < 0:
        raise CpuSpecError(f"negative CPU id {ids[0]} in {ids}")
    ranges: list[str] = []
    start = previous = ids[0]
    for cpu in ids[1:] + [None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        ranges.append(str(start) if start == previous else f"{start}-{previous}")
        if cpu is not None:
            start = previous = cpu
    return ",".join(ranges)


def online_cpus(root: Path = Path("/sys/devices/system/cpu")) -> tuple[int, ...]:
    """CPU ids that are online, from ``root/online``; this process's affinity if that file is missing."""
    try:
        return parse_cpus((root / "online").read_text())
    except (OSError, CpuSpecError):
        return tuple(sorted(os.sched_getaffinity(0)))


def online_subset(spec: str, option: str, root: Path = Path("/sys/devices/system/cpu")) -> tuple[int, ...]:
    """``spec`` parsed, each CPU online. Raises CpuSpecError naming ``option`` and the CPUs that are online."""
    cpus = parse_cpus(spec)
    online = online_cpus(root)
    missing = sorted(set(cpus) - set(online))
    if missing:
        raise CpuSpecError(f"{option} {spec} names CPUs that are not online ({format_cpus(missing)}): "
                           f"this node's online CPUs are {format_cpus(online)}; give a list of those, "
                           f"e.g. {option} {format_cpus(online)}")
    return cpus
