"""CPU lists in the kernel's list format."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adloader.cpuspec import CpuSpecError, format_cpus, online_cpus, online_subset, parse_cpus


def test_parse_and_format_examples() -> None:
    assert parse_cpus("0-3,6") == (0, 1, 2, 3, 6)
    assert parse_cpus(" 6,0-1, 1 \n") == (0, 1, 6)
    assert format_cpus((6, 0, 1, 2, 3)) == "0-3,6"
    assert format_cpus([5]) == "5"


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1))
def test_format_then_parse_is_the_sorted_set(cpus: set[int]) -> None:
    assert parse_cpus(format_cpus(cpus)) == tuple(sorted(cpus))


@pytest.mark.parametrize("spec", ["", "  ", "a", "1,,2", "3-1", "-1", "1-", "0-2-4", "1.5"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(CpuSpecError):
        parse_cpus(spec)


def test_format_refuses_empty_and_negative() -> None:
    with pytest.raises(CpuSpecError):
        format_cpus(())
    with pytest.raises(CpuSpecError):
        format_cpus((-1, 0))


def test_online_cpus_reads_sysfs_or_falls_back_to_affinity(tmp_path: Path) -> None:
    (tmp_path / "online").write_text("0-2,4\n")
    assert online_cpus(tmp_path) == (0, 1, 2, 4)
    assert online_cpus(tmp_path / "missing") == tuple(sorted(os.sched_getaffinity(0)))


def test_an_offline_cpu_is_refused_with_the_online_ones_to_choose_from(tmp_path: Path) -> None:
    (tmp_path / "online").write_text("0-3\n")
    assert online_subset("1-2", "--cpus", tmp_path) == (1, 2)
    with pytest.raises(CpuSpecError) as refused:
        online_subset("2-5", "--cpus", tmp_path)
    assert str(refused.value) == ("--cpus 2-5 names CPUs that are not online (4-5): this node's online CPUs are "
                                  "0-3; give a list of those, e.g. --cpus 0-3")
