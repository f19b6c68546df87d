"""The controller under load (a real controller subprocess): 64 reporting clients in two
jobs' cgroups, 1,000 connect/disconnect cycles and 16 slow clients holding half-written
lines, all at once. Nobody may be kept waiting or refused, and the controller's file
descriptors must return to their baseline. No latency is asserted here: the benchmark
(``python -m reliability.bench``) runs 256 clients for a minute and 10,000 cycles and
reports p50/p99 latency, memory and CPU."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from reliability.load import run_load
from reliability.node import Node
from bench.controller_process import ControllerProcess


@pytest.fixture
def node(start_controller: Callable[..., ControllerProcess]) -> Iterator[Node]:
    """Policy static (no quota): the load jobs' own clients are not throttled by a CPU split."""
    node = Node(start_controller("--policy", "static", "--cpus", "0-1"), cpus=2, policy="static")
    yield node
    node.close()


def test_many_reporting_clients_connection_churn_and_slow_clients_block_nobody_and_leak_nothing(node: Node) -> None:
    report = run_load(node, jobs=2, connections=32, seconds=5.0, cycles=1000, slow_clients=16)
    assert report.violations == [], "\n".join(report.violations)
    assert report.requests == report.replies and report.replies >= 64 * 3, report  # about one per rank per second
    assert report.cycles == 1000 and report.blocked == 0
    assert report.fds_peak > report.fds_baseline + 64 and report.fds_after <= report.fds_baseline, report
    _, left = node.wait_consistent(2 * node.controller.period + 3.0)  # the load jobs' groups are gone
    assert left == []
