"""bench/machine.py: every benchmark document names the machine it ran on, read from a /proc tree."""
from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from bench.machine import cpu_model, describe

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu avx2

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
"""


def test_the_cpu_model_is_cpuinfos_else_what_python_knows(tmp_path: Path) -> None:
    x86, arm, missing = tmp_path / "x86", tmp_path / "arm", tmp_path / "missing"
    x86.mkdir()
    (x86 / "cpuinfo").write_text(CPUINFO)
    arm.mkdir()
    (arm / "cpuinfo").write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")
    assert cpu_model(x86) == "AMD EPYC 9B14"
    assert cpu_model(arm) == cpu_model(missing) == (platform.processor() or platform.machine())


def test_a_document_names_the_cpu_its_counts_memory_and_software(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    machine = describe(tmp_path)
    assert machine["cpu_model"] == "AMD EPYC 9B14"
    assert machine["cpus"] >= machine["affinity"] >= 1
    assert machine["memory_bytes"] > 2**28
    assert machine["python"] == platform.python_version()
    assert machine["torch"] == metadata.version("torch")
