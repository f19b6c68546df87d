"""What the registry hands the policies beyond the windowed rates: a job's declared
length for jct (``adloader run --samples N`` -> Register.samples -> remaining samples,
counted down by the reports) and M measured over each rank's whole run."""
from __future__ import annotations

import argparse

import pytest

from adloader import protocol
from controller.registry import Registry
from launcher import cli as launcher_cli


def _report(rank: int, samples: int, batches: int = 0, compute_s: float = 0.0) -> protocol.Report:
    return protocol.Report(job_id="j1", rank=rank, world_size=2, batch_size=32, samples=samples,
                           batches=batches, compute_s=compute_s)


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


def test_remaining_samples_count_down_over_all_ranks_and_the_length_stays() -> None:
    registry = Registry(window_s=5.0, clock=lambda: 100.0, wall_clock=lambda: 1.7e9)
    registry.register("j1", name="bert", uid=0, gpus=2, launcher_pid=1, cgroup="/cg/j1", declared_samples=10_000)
    assert registry.views({})[0].remaining_samples == 10_000
    registry.record_report("j1", _report(0, 3_000))
    registry.record_report("j1", _report(1, 2_500))
    assert registry.views({})[0].remaining_samples == 4_500
    assert registry.views({})[0].length_samples == 10_000  # what adaptive ranks by: it does not drift
    registry.record_report("j1", _report(0, 9_000))
    assert registry.views({})[0].remaining_samples == 0  # never negative
    registry.register("j2", name="other", uid=0, gpus=1, launcher_pid=2, cgroup="/cg/j2")
    other = next(v for v in registry.views({}) if v.job_id == "j2")
    assert other.remaining_samples is None and other.length_samples is None


def test_m_is_measured_over_each_ranks_whole_run_once_it_has_run_a_few_steps() -> None:
    clock = [100.0]
    registry = Registry(window_s=5.0, clock=lambda: clock[0], wall_clock=lambda: 1.7e9)
    registry.register("j1", name="bert", uid=0, gpus=2, launcher_pid=1, cgroup="/cg/j1")
    registry.record_report("j1", _report(0, 96, batches=3, compute_s=0.2))
    registry.measure()
    assert registry.views({})[0].max_throughput is None  # warm-up: not measured yet
    # a starved rank: one step every two seconds; its 5 s window would hold two or three of them
    for step in range(4, 12):
        clock[0] += 2.0
        registry.record_report("j1", _report(0, 32 * step, batches=step, compute_s=0.1 * step))
    registry.record_report("j1", _report(1, 640, batches=20, compute_s=1.0))
    registry.measure()
    assert registry.views({})[0].max_throughput == pytest.approx(32 * 11 / 1.1 + 640 / 1.0)


def test_the_policy_is_told_the_worker_count_a_window_was_measured_at_and_not_a_mixed_one() -> None:
    clock = [100.0]
    registry = Registry(window_s=5.0, clock=lambda: clock[0], wall_clock=lambda: 1.7e9)
    registry.register("j1", name="reader", uid=0, gpus=2, launcher_pid=1, cgroup="/cg/j1")

    def report(rank: int, workers: int) -> None:
        registry.record_report("j1", protocol.Report(job_id="j1", rank=rank, world_size=2, batch_size=32,
                                                     samples=int(clock[0]) * 32, num_workers=workers))

    report(0, 2)
    registry.measure()
    assert registry.views({})[0].steady_workers is None  # one report: no window yet
    for _ in range(6):
        clock[0] += 1.0
        report(0, 2)
        report(1, 2)
    registry.measure()
    assert registry.views({})[0].steady_workers == 2
    clock[0] += 1.0
    report(1, 3)  # rank 1 resized: the window mixes two counts
    registry.measure()
    assert registry.views({})[0].steady_workers is None
    for _ in range(6):  # once the old count has left the window, the new one is steady
        clock[0] += 1.0
        report(0, 3)
        report(1, 3)
    registry.measure()
    assert registry.views({})[0].steady_workers == 3



def test_the_policy_is_told_the_batches_cores_and_loads_in_flight_of_the_window_its_rates_were_counted_in() -> None:
    """A job that has outgrown its model is read from its window's cores against its rate, and
    trusted only as far as the batches it counted (controller/policies/outgrown.py); a reader's
    workers are sized by the batches its loaders were loading at once (shares.reader_workers)."""
    clock = [100.0]
    registry = Registry(window_s=5.0, clock=lambda: clock[0], wall_clock=lambda: 1.7e9)
    registry.register("j1", name="bert", uid=0, gpus=2, launcher_pid=1, cgroup="/cg/j1")
    for step in range(12):  # rank 0: 2 batches, half a core and 0.6 s loading a second; rank 1: half that
        for rank, per_s, cores, loading in ((0, 2, 0.5, 0.6), (1, 1, 0.25, 0.3)):
            registry.record_report("j1", protocol.Report(
                job_id="j1", rank=rank, world_size=2, batch_size=32, samples=32 * per_s * step,
                batches=per_s * step, worker_cpu_s=cores * step, worker_load_s=loading * step))
        clock[0] += 1.0
    registry.measure()
    (view,) = registry.views({})
    # the 5 s window holds the reports of seconds 107-111: four seconds of both ranks
    assert view.window_batches == pytest.approx(3 * 4)
    assert view.cores_used == pytest.approx(0.75)  # no group CPU accounted: the workers' own
    assert view.loads_in_flight == pytest.approx(0.9)
