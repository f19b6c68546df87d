"""A job's declared length reaches the jct policy: ``adloader run --samples N`` ->
Register.samples -> the registry's remaining samples, counted down by the reports."""
from __future__ import annotations

import argparse

from adloader import protocol
from controller.registry import Registry
from launcher import cli as launcher_cli


def _report(rank: int, samples: int) -> protocol.Report:
    return protocol.Report(job_id="j1", rank=rank, world_size=2, batch_size=32, samples=samples)


def test_register_carries_the_length_and_old_messages_still_decode() -> None:
    message = protocol.Register(name="bert", gpus=2, samples=120_000)
    assert protocol.decode(protocol.encode(message)) == message
    legacy = protocol.decode(b'{"v":1,"type":"register","name":"bert","gpus":1}\n')
    assert isinstance(legacy, protocol.Register) and legacy.samples is None


def test_the_launcher_takes_the_length_on_its_command_line() -> None:
    parser = argparse.ArgumentParser()
    launcher_cli.configure(parser)
    args = parser.parse_args(["--samples", "5000", "--", "python", "train.py"])
    assert args.samples == 5000


def test_remaining_samples_count_down_over_all_ranks() -> None:
    registry = Registry(window_s=5.0, clock=lambda: 100.0, wall_clock=lambda: 1.7e9)
    registry.register("j1", name="bert", uid=0, gpus=2, launcher_pid=1, cgroup="/cg/j1", total_samples=10_000)
    assert registry.views({})[0].remaining_samples == 10_000
    registry.record_report("j1", _report(0, 3_000))
    registry.record_report("j1", _report(1, 2_500))
    assert registry.views({})[0].remaining_samples == 4_500
    registry.record_report("j1", _report(0, 9_000))
    assert registry.views({})[0].remaining_samples == 0  # never negative
    registry.register("j2", name="other", uid=0, gpus=1, launcher_pid=2, cgroup="/cg/j2")
    assert next(v for v in registry.views({}) if v.job_id == "j2").remaining_samples is None
