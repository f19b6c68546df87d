"""The controller under faults, end to end: real controller processes killed with SIGKILL
at named fault points and at random moments of a busy run, real cgroups, real jobs
(reliability/job.py under ``adloader run``) that must train on throughout.

After every restart the node must become consistent (reliability/node.py lists the
invariants: every live job adopted with the policy's limits back in the kernel, no
orphaned group, no process lost out of its group, the other owner's cgroup untouched)
and every job must keep training. The benchmark (reliability/bench.py) runs the same
scenarios longer and counts them.
"""
from __future__ import annotations

import random
from typing import Callable, Iterator

import pytest

from reliability.faults import (
    FAULT_POINTS, controller_away, crash_at_fault_point, crash_during_churn, dying_jobs,
)
from reliability.node import Node
from reliability.state import (
    run_on_unwritable_state_dir, saved_state, small_tmpfs, start_on_state, state_variants,
)
from bench.controller_process import ControllerProcess

PERIOD = 0.5
SETTLE_S = 2 * PERIOD + 3.0
"""Two control periods, plus slack for a machine shared with other test runs."""
MAX_STEP_GAP_S = 5.0
"""A training step is 50 ms; a job whose step took this long (and three times as long as an
unmanaged job's longest on the same CPUs: Node.training_stopped) stopped training."""


@pytest.fixture
def node(start_controller: Callable[..., ControllerProcess]) -> Iterator[Node]:
    node = Node(start_controller("--policy", "even", "--cpus", "0", period=PERIOD))
    yield node
    node.close()


def test_a_crash_at_each_named_fault_point_is_recovered_from(node: Node) -> None:
    assert node.start_registered(2) == []
    outcomes = [crash_at_fault_point(node, spec, SETTLE_S) for spec in FAULT_POINTS]
    for outcome in outcomes:
        assert outcome.crashed, f"{outcome.fault} was never reached; log:\n{node.controller.log()[-3000:]}"
        assert outcome.violations == [], outcome
    node.stop_all()
    assert node.training_stopped(MAX_STEP_GAP_S) == []


def test_kill_9_at_random_moments_of_a_busy_run(node: Node) -> None:
    assert node.start_registered(2) == []
    outcomes = crash_during_churn(node, kills=3, settle_s=SETTLE_S, rng=random.Random(1))
    assert [o.violations for o in outcomes] == [[], [], []], outcomes
    node.stop_all()
    assert node.training_stopped(MAX_STEP_GAP_S) == []


def test_a_damaged_state_file_never_stops_the_controller_from_starting(node: Node) -> None:
    assert node.start_registered(1) == []
    original = saved_state(node)
    lengths = (len(original) // 2, len(original) - 1)  # the second only loses the newline: still usable
    kinds = ("truncated", "checksum wrong", "from a future version", "leftover temp")  # the benchmark tries them all
    for variant in [v for v in state_variants(original, lengths) if v.label.startswith(kinds)]:
        outcome = start_on_state(node, variant, SETTLE_S)
        assert outcome.violations == [], (variant.label, outcome.violations)
    assert node.training_stopped(MAX_STEP_GAP_S) == []


@pytest.fixture
def node_on_tmpfs(start_controller: Callable[..., ControllerProcess]) -> Iterator[Node]:
    """A node whose controller keeps its state on a 64 KiB tmpfs of its own."""
    controller = start_controller("--policy", "even", "--cpus", "0", period=PERIOD)
    controller.kill()
    with small_tmpfs(controller.state_dir):
        controller.start()
        node = Node(controller)
        try:
            yield node
        finally:
            node.close()
            controller.kill()


@pytest.mark.parametrize("damage", ["full", "read-only"])
def test_a_full_or_read_only_state_directory_is_survived_and_said(node_on_tmpfs: Node, damage: str) -> None:
    assert node_on_tmpfs.start_registered(1) == []
    assert run_on_unwritable_state_dir(node_on_tmpfs, damage, SETTLE_S) == []
    assert node_on_tmpfs.training_stopped(MAX_STEP_GAP_S) == []


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_jobs_train_on_while_the_controller_is_away_and_their_loaders_reconnect(
    start_controller: Callable[..., ControllerProcess], how: str,
) -> None:
    node = Node(start_controller("--policy", "even", "--cpus", "0-1", period=PERIOD), cpus=2)
    try:
        outcome = controller_away(node, how)
        assert outcome.violations == [], outcome
        assert outcome.steps_while_away >= 20 and outcome.reconnect_s is not None
        node.stop_all()
        assert node.training_stopped(MAX_STEP_GAP_S) == []
    finally:
        node.close()


def test_jobs_that_die_in_every_way_are_removed_or_kept_as_they_should(node: Node) -> None:
    assert node.start_registered(1) == []
    outcomes = dying_jobs(node, SETTLE_S)
    assert [(o.fault, o.violations) for o in outcomes] == [(o.fault, []) for o in outcomes]
    assert all(o.cleanup_s is not None for o in outcomes[:2]), outcomes
    assert node.training_stopped(MAX_STEP_GAP_S) == []
