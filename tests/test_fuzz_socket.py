"""Fuzzing the controller's socket (a real controller subprocess): more than 10,000
malformed messages (mutations of valid messages of every type, hypothesis-generated
documents and bytes, invalid UTF-8, NUL bytes, NaN, huge numbers, deep nesting, lines at
and far over the bound, half lines, abandoned connections). Every line must get the Error
the protocol gives it, in order, or a clean close; the controller must count exactly
those errors, change nothing, keep its memory bounded, and keep answering a reporting
job and a status poller throughout. reliability/fuzz.py holds the generators and
the oracle."""
from __future__ import annotations

import random
from typing import Callable, Iterator

import pytest

from reliability.fuzz import FuzzDriver, expected, run_fuzz, templates
from reliability.node import Node
from bench.controller_process import ControllerProcess

RSS_GROWTH_BOUND = 32 * 1024 * 1024
"""Generous: the bound is about leaks that grow with the number of messages (10,000 of
them, many near 128 KiB), not about the allocator keeping a few buffers."""


@pytest.fixture
def node(start_controller: Callable[..., ControllerProcess]) -> Iterator[Node]:
    node = Node(start_controller("--policy", "even", "--cpus", "0"))
    yield node
    node.close()


def test_ten_thousand_malformed_messages_get_their_error_and_change_nothing(node: Node) -> None:
    bystander = node.start_job(name="bystander", report_every=0.1)
    assert node.wait_registered(bystander), bystander.handle.output()
    report = run_fuzz(node, bystander, mutations=9600, examples=40, sessions=40)
    assert report.violations == [], "\n".join(report.violations)
    assert report.messages >= 10_000, report
    assert len(report.errors_by_code) >= 8, report.errors_by_code  # the mix reached many kinds of error
    assert report.rss_after - report.rss_before < RSS_GROWTH_BOUND, report
    assert report.bystander_status_requests > 0 and report.bystander_reports_during > 0


def test_half_a_line_then_close_is_dropped_not_answered_or_counted(node: Node) -> None:
    driver = FuzzDriver(node.controller.socket, set(), set())
    before = node.controller.status().errors_total
    driver.abuse_connections(random.Random(1), 4 * 25, templates([]))
    assert node.controller.status().errors_total == {**before, "too_long": before.get("too_long", 0) + 25}
    assert expected(b"x" * 200_000, set(), set()).closes
