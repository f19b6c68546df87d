"""The job registry: windowed rates from cumulative per-rank reports, the policy's views,
snapshots, and the seams for the throughput predictor and the job history."""
from __future__ import annotations

import logging
from collections import deque

import pytest

from adloader.protocol import Report
from adloader.protocol import JobSnapshot
from controller.allocations import AllocationStore, ApplyFailure, JobAllocations
from controller.policies.base import JobAllocation
from controller.priors import Recollection
from controller.registry import Registry
from controller.state import LearntModel
from throughput_model.curves import MIN_OBSERVATIONS, WARMUP_OBSERVATIONS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _registry(clock: Clock, **kwargs: object) -> Registry:
    return Registry(window_s=5.0, clock=clock, wall_clock=lambda: 1.7e9, **kwargs)  # type: ignore[arg-type]


def _register(registry: Registry, job_id: str = "j1", **kwargs: object) -> None:
    values: dict[str, object] = dict(name="resnet", uid=1000, gpus=2, launcher_pid=42, cgroup="/cg/j1")
    values.update(kwargs)
    registry.register(job_id, **values)  # type: ignore[arg-type]


def _report(rank: int, samples: int, wait: float, compute: float, cpu: float, read: int, batches: int | None = None,
            **kw: object) -> Report:
    return Report(job_id="j1", rank=rank, world_size=2, batch_size=32, samples=samples,
                  batches=samples // 32 if batches is None else batches,
                  data_wait_s=wait, compute_s=compute, worker_cpu_s=cpu, read_bytes=read, num_workers=3, **kw)


def test_rates_are_window_differences_summed_over_ranks(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry)
    registry.record_report("j1", _report(0, 320, 1.0, 2.0, 3.0, 1_000))
    registry.record_report("j1", _report(1, 640, 0.5, 2.5, 4.0, 2_000))
    clock.now += 2.0
    registry.record_report("j1", _report(0, 320 + 400, 1.0 + 0.6, 2.0 + 1.4, 3.0 + 8.0, 1_000 + 4_000_000))
    registry.record_report("j1", _report(1, 640 + 200, 0.5 + 1.0, 2.5 + 1.0, 4.0 + 6.0, 2_000 + 1_000_000))
    registry.measure()
    rates = registry.get("j1").measurement.rates  # type: ignore[union-attr]
    assert rates.achieved == pytest.approx(400 / 2 + 200 / 2)
    assert rates.data_wait_ratio == pytest.approx((0.6 + 1.0) / (0.6 + 1.0 + 1.4 + 1.0))
    assert rates.max_throughput == pytest.approx(400 / 1.4 + 200 / 1.0)
    assert rates.cpu_s_per_sample == pytest.approx((8.0 + 6.0) / 600)
    assert rates.bytes_per_sample == pytest.approx(5_000_000 / 600)


def test_a_restarted_rank_starts_its_window_over_and_old_reports_age_out(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry)
    registry.record_report("j1", _report(0, 1000, 0, 10, 0, 0))
    clock.now += 1
    registry.record_report("j1", _report(0, 10, 0, 0.1, 0, 0))  # counters went back: the rank restarted
    job = registry.get("j1")
    registry.measure()
    assert job.measurement.rates.achieved is None  # type: ignore[union-attr]
    clock.now += 1
    registry.record_report("j1", _report(0, 110, 0, 1.1, 0, 0))
    registry.measure()
    assert job.measurement.rates.achieved == pytest.approx(100.0)  # type: ignore[union-attr]
    clock.now += 10  # silent for longer than the window
    registry.measure({"j1": 1.5})
    assert job.measurement.rates.achieved is None  # type: ignore[union-attr]
    snap = registry.snapshot(job, pids={42})  # type: ignore[arg-type]
    assert snap.ranks_reporting == 0 and snap.samples_total == 110 and snap.state == "running"


def test_the_prediction_stands_in_for_m_until_it_is_measured(clock: Clock) -> None:
    calls: list[tuple[dict[str, float], int]] = []

    def predictor(features: dict[str, float], gpus: int) -> tuple[float, float, float]:
        calls.append((features, gpus))
        return 500.0, 400.0, 650.0

    registry = _registry(clock, predictor=predictor)
    _register(registry, features={"flops": 4e9})
    assert calls == [({"flops": 4e9}, 2)]
    view = registry.views({})[0]
    assert (view.max_throughput, view.max_throughput_interval) == (500.0, (400.0, 650.0))
    registry.record_report("j1", _report(0, 0, 0, 0, 0, 0))
    clock.now += 1
    registry.record_report("j1", _report(0, 300, 0, 1.0, 0, 0))
    registry.measure()
    view = registry.views({})[0]
    assert (view.max_throughput, view.max_throughput_interval) == (300.0, None)
    snap = registry.snapshot(registry.get("j1"), pids=set())  # type: ignore[arg-type]
    assert (snap.max_sps_predicted, snap.max_sps_measured) == (500.0, 300.0)


def test_a_failing_predictor_leaves_the_job_unpredicted(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    def broken(features: dict[str, float], gpus: int) -> None:
        raise ValueError("model file missing")

    registry = _registry(clock, predictor=broken)
    with caplog.at_level(logging.ERROR):
        _register(registry, features={"flops": 1.0})
    assert registry.views({})[0].max_throughput is None
    assert "throughput prediction failed for job j1" in caplog.text


def test_features_arriving_with_a_report_are_predicted_then(clock: Clock) -> None:
    registry = _registry(clock, predictor=lambda features, gpus: (features["flops"], 1.0, 2.0))
    _register(registry)
    assert registry.views({})[0].max_throughput is None
    registry.record_report("j1", _report(0, 0, 0, 0, 0, 0, features={"flops": 77.0}))
    assert registry.views({})[0].max_throughput == 77.0


def test_views_skip_ended_jobs_and_carry_what_is_in_force(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry, "j1")
    _register(registry, "j2", requested_workers=6)
    in_force = JobAllocation(cores=1.5, workers=2)
    views = registry.views({"j2": in_force})
    assert [v.job_id for v in views] == ["j1", "j2"]
    assert views[1].current == in_force and views[1].requested_workers == 6 and views[1].gpus == 2
    assert views[0].current == JobAllocation()
    registry.end("j1", 0)
    assert [v.job_id for v in registry.views({})] == ["j2"]
    snap = registry.snapshot(registry.get("j1"), pids=set())  # type: ignore[arg-type]
    assert snap.state == "gone"


def test_each_step_adds_the_windows_loader_cores_and_rate_to_the_loading_curve(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry)
    registry.measure()
    assert registry.views({})[0].loading_curve == ()  # nothing reported yet
    for rank in (0, 1):
        registry.record_report("j1", _report(rank, 0, 0, 0, 0, 0))
    clock.now += 2
    registry.record_report("j1", _report(0, 200, 0.2, 1.8, 1.5, 0))  # 0.75 core, 100 samples/s
    registry.record_report("j1", _report(1, 100, 1.0, 1.0, 0.5, 0))  # 0.25 core, 50 samples/s
    registry.measure()
    rates = registry.get("j1").measurement.rates  # type: ignore[union-attr]
    assert rates.loader_cores == pytest.approx(1.0) and rates.achieved == pytest.approx(150.0)
    assert registry.get("j1").loading_curve.observations == 0  # type: ignore[union-attr]  # warm-up window
    for _ in range(WARMUP_OBSERVATIONS + MIN_OBSERVATIONS - 1):  # the same window, step after step
        registry.measure()
    assert registry.get("j1").loading_curve.observations == MIN_OBSERVATIONS  # type: ignore[union-attr]
    ((cores, sps),) = registry.views({})[0].loading_curve
    assert (cores, sps) == (pytest.approx(1.0), pytest.approx(150.0))


def test_a_group_regrouped_is_read_afresh_and_its_curve_restarts_without_a_warm_up(clock: Clock) -> None:
    """Until its training process is moved out, a job's group burns that process's start-up
    CPU (2 cores here) besides its loaders' (0.5): the curve learnt from those windows is
    five times too dear. Regrouped, the group's CPU is read from the move on and the curve
    rests on the windows after it alone, from the first."""
    registry = _registry(clock)
    _register(registry)
    group_cpu = 0.0
    for step in range(12):  # 0.5 s steps, 100 samples/s delivered, the rank's start-up in the group
        registry.record_report("j1", _report(0, 50 * step, 0.0, 0.5 * step, 0.25 * step, 0, batches=step))
        registry.measure({"j1": group_cpu})
        clock.now += 0.5
        group_cpu += 0.5 * 2.5
    job = registry.get("j1")
    assert job is not None and job.loading_curve.cpu_s_per_sample() == pytest.approx(0.025)
    registry.regrouped("j1")
    assert job.loading_curve.observations == 0 and job.cpu_samples == deque()
    for step in range(12, 12 + MIN_OBSERVATIONS + 1):  # the loaders alone in the group now
        registry.record_report("j1", _report(0, 50 * step, 0.0, 0.5 * step, 0.25 * step, 0, batches=step))
        registry.measure({"j1": group_cpu})
        clock.now += 0.5
        group_cpu += 0.5 * 0.5
    assert job.loading_curve.observations == MIN_OBSERVATIONS  # the first read is the baseline, no warm-up after
    assert job.loading_curve.cpu_s_per_sample() == pytest.approx(0.005)
    registry.regrouped("gone")  # a job that left meanwhile: nothing to do


def test_a_job_without_a_gpu_has_no_gpu_idle(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry, gpus=0)
    registry.record_report("j1", _report(0, 0, 0, 0, 0, 0))
    clock.now += 1
    registry.record_report("j1", _report(0, 50, 0.5, 0.5, 1.0, 100, batches=10))
    registry.measure({"j1": 1.0})
    snap = registry.snapshot(registry.get("j1"), pids={42})  # type: ignore[arg-type]
    assert snap.achieved_sps and snap.max_sps_measured and snap.gpu_idle_ratio is None


def test_unmanaged_ranks_reports_are_no_loaders_counters_and_the_job_is_unmanaged_at_once(clock: Clock) -> None:
    """A rank whose loader fell back to torch's still reports (the job is alive), but its counters
    are not a loader's: they make no loading-curve window and no rate, and the job is unmanaged."""
    registry = _registry(clock)
    _register(registry)
    fallback = "loader fell back to torch's (in_order=False)"
    for step in range(4):
        registry.record_report("j1", _report(0, 0, 0, step, 0, 0, unmanaged_reason=fallback))
        registry.measure({"j1": 0.8 * step})
        clock.now += 1
    job = registry.get("j1")
    assert job is not None and job.loading_curve.observations == 0 and job.measurement.rates.achieved is None
    snap = registry.snapshot(job, pids={42})
    assert (snap.state, snap.unmanaged_reason, snap.ranks_reporting) == ("unmanaged", fallback, 0)
    assert snap.cores_used == pytest.approx(0.8)  # its group's CPU, which its share is based on
    (view,) = registry.views({})
    assert view.unmanaged and view.cores_used == pytest.approx(0.8)


def test_snapshots_sum_ranks_and_the_idle_ratio_follows_achieved_over_max(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry)
    given = JobAllocation(cores=1.5, cpus=(0, 1), read_bps=10_000_000, workers=2)
    allocation = JobAllocations(wanted=given, applied=given)
    assert registry.snapshot(registry.get("j1"), pids={42}, allocation=allocation).state == "starting"  # type: ignore[arg-type]
    for rank in (0, 1):
        registry.record_report("j1", _report(rank, 0, 0, 0, 0, 0))
    clock.now += 1
    for rank in (0, 1):  # ten steps each (M counts after MIN_BATCHES_FOR_M)
        registry.record_report("j1", _report(rank, 50, 0.5, 0.5, 1.0, 100, batches=10))
    registry.measure({"j1": 3.25})
    snap = registry.snapshot(registry.get("j1"), pids={42, 43}, allocation=allocation)  # type: ignore[arg-type]
    achieved, max_sps = 100.0, 200.0
    assert snap.achieved_sps == pytest.approx(achieved) and snap.max_sps_measured == pytest.approx(max_sps)
    assert snap.gpu_idle_ratio == pytest.approx(1 - achieved / max_sps)
    assert (snap.ranks_reporting, snap.workers_running, snap.workers_target) == (2, 6, 4)
    assert (snap.cores, snap.cpus, snap.read_bps, snap.pids, snap.cpu_seconds_total) == (
        1.5, (0, 1), 10_000_000, (42, 43), 3.25)
    assert (snap.samples_total, snap.read_bytes_total, snap.batch_size) == (100, 200, 32)


def test_persisted_jobs_are_adopted_disconnected_and_the_history_hook_gets_the_final_snapshot(clock: Clock) -> None:
    finished: list[tuple[JobSnapshot, object, object, object, object]] = []
    registry = _registry(clock)
    _register(registry, requested_workers=4, features={"flops": 1.0}, declared_samples=5000)
    allocations = AllocationStore()
    allocations.want("j1", JobAllocation(cores=1.0, workers=1))
    saved = registry.persisted(allocations)
    restarted, restored = _registry(clock, on_job_finished=lambda *args: finished.append(args)), AllocationStore()
    job = restarted.adopt(saved["j1"])
    restored.restore("j1", saved["j1"].wanted, saved["j1"].applied)
    assert (job.connected, job.adopted, restored.get("j1").wanted, job.requested_workers) == (
        False, True, JobAllocation(cores=1.0, workers=1), 4)
    assert restarted.persisted(restored) == saved
    restarted.end("j1", 3)
    final = restarted.remove("j1", pids=set(), cpu_seconds=9.5)
    # the declared length survives the restart: the history records it with the run
    assert finished == [(final, {"flops": 1.0}, (), 3, 5000)] and final is not None and final.cpu_seconds_total == 9.5 and "j1" not in restarted


def test_a_failing_history_hook_does_not_keep_the_job(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    def broken(snapshot: JobSnapshot, features: object, curve: object, exit_code: object, declared: object) -> None:
        raise OSError("disk full")

    registry = _registry(clock, on_job_finished=broken)
    _register(registry)
    with caplog.at_level(logging.ERROR):
        registry.remove("j1", pids=set(), cpu_seconds=0.0)
    assert "j1" not in registry and "on_job_finished hook failed for job j1" in caplog.text


def test_a_recurring_job_gets_its_length_and_loading_cost_from_history_before_any_report(clock: Clock) -> None:
    asked: list[tuple[str, object, int | None]] = []

    def recall(name: str, features: object, declared: int | None) -> Recollection | None:
        asked.append((name, features, declared))
        return Recollection(samples=1000.0, cpu_s_per_sample=0.004, bytes_per_sample=2048.0) if name == "resnet" else None

    registry = _registry(clock, recall=recall)
    job = registry.register("j1", name="resnet", uid=0, gpus=1, launcher_pid=1, cgroup="g", features={"flops": 2.0},
                            declared_samples=3000)
    other = registry.register("j2", name="new", uid=0, gpus=1, launcher_pid=2, cgroup="g")
    assert asked == [("resnet", {"flops": 2.0}, 3000), ("new", None, None)]
    # the length learnt from the history goes before the declared one, which the history keeps
    assert job.remaining == 1000.0 and job.declared_samples == 3000
    assert other.remaining is None
    recurring, new = registry.views({})
    # Before its first report the recurring job's loading curve is its history's: 1 core buys 250 samples/s.
    assert recurring.loading_curve == ((1.0, 250.0),)
    assert (recurring.cpu_s_per_sample, recurring.bytes_per_sample) == (0.004, 2048.0)
    assert new.loading_curve == () and new.cpu_s_per_sample is None


def test_a_prediction_not_ready_at_registration_is_asked_for_again_each_step(clock: Clock) -> None:
    answers: list[tuple[float, float, float] | None] = [None, (100.0, 80.0, 120.0)]
    registry = _registry(clock, predictor=lambda features, gpus: answers.pop(0))
    _register(registry, features={"flops": 1.0})
    job = registry.get("j1")
    assert job is not None and job.predicted is None
    registry.predict_pending()
    assert job.predicted == (100.0, 80.0, 120.0)
    registry.predict_pending()  # answered: not asked again
    assert answers == []


def test_an_adopted_job_plans_with_what_the_earlier_controller_measured_until_it_measures_again(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry)
    for rank in (0, 1):
        registry.record_report("j1", _report(rank, 0, 0, 0, 0, 0))
    clock.now += 2
    registry.record_report("j1", _report(0, 200, 0.2, 1.0, 1.5, 20_000, batches=10))
    registry.record_report("j1", _report(1, 100, 1.0, 0.5, 0.5, 10_000, batches=10))
    for _ in range(WARMUP_OBSERVATIONS + MIN_OBSERVATIONS):
        registry.measure()
    before = registry.views({})[0]
    saved = registry.persisted(AllocationStore())["j1"]
    assert saved.model == LearntModel(
        max_throughput=pytest.approx(200 / 1.0 + 100 / 0.5), cpu_s_per_sample=pytest.approx(2.0 / 300),
        bytes_per_sample=pytest.approx(100.0), loading_observations=saved.model.loading_observations,
    ) and len(saved.model.loading_observations) == MIN_OBSERVATIONS

    restarted = _registry(clock)
    restarted.adopt(saved)
    restarted.measure()  # the first step after the restart: no report has arrived yet
    after = restarted.views({})[0]
    assert (after.max_throughput, after.cpu_s_per_sample, after.bytes_per_sample, after.loading_curve) == (
        before.max_throughput, before.cpu_s_per_sample, before.bytes_per_sample, before.loading_curve)


def test_snapshots_show_what_is_applied_and_what_failed_to_apply(clock: Clock) -> None:
    registry = _registry(clock)
    _register(registry)
    allocations = AllocationStore()
    allocations.want("j1", JobAllocation(cpu_weight=300, read_bps=5_000_000, workers=2))
    allocations.record_applied("j1", JobAllocation(cpu_weight=300, workers=2),
                               (ApplyFailure("read_bps", "blkio.throttle.read_bps_device: No such device"),))
    snap = registry.snapshot(registry.get("j1"), pids=set(), allocation=allocations.get("j1"))  # type: ignore[arg-type]
    assert (snap.cpu_weight, snap.read_bps, snap.workers_target) == (300, None, 2)
    assert snap.failed_to_apply == {"read_bps": "blkio.throttle.read_bps_device: No such device"}


def test_the_curve_counts_the_batches_its_windows_were_measured_from(clock: Clock) -> None:
    """The evidence behind the curve (JobView.curve_batches): the batches all ranks delivered
    over the steps of its windows; none before the curve rests on its own windows."""
    registry = _registry(clock)
    _register(registry)
    batches = {0: 0, 1: 0}
    for step in range(WARMUP_OBSERVATIONS + MIN_OBSERVATIONS + 1):
        clock.now += 1
        for rank in (0, 1):
            batches[rank] += 3 + rank  # 7 a step in all
            registry.record_report("j1", _report(rank, batches[rank] * 32, 0.1 * step, 0.5 * step, 0.4 * step, 0))
        registry.measure()
        view = registry.views({})[0]
        if view.curve_windows is not None and view.curve_windows < MIN_OBSERVATIONS:
            assert view.curve_batches is None
    # the first step's reports start the windows; every later one adds a point of 7 batches
    assert view.curve_windows == MIN_OBSERVATIONS
    assert view.curve_batches == 7 * MIN_OBSERVATIONS


def test_a_job_whose_samples_get_dearer_is_logged_as_changing_phase_once(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    """One core throughout, 640 samples a second, then 320 (each sample costs twice the CPU):
    once the curve drops the windows of the first phase the registry says so, with both costs."""
    registry = _registry(clock)
    _register(registry, gpus=1)
    samples = cpu = 0.0

    def step(rate: float) -> None:
        nonlocal samples, cpu
        clock.now += 1.0
        samples, cpu = samples + rate, cpu + 1.0
        registry.record_report("j1", Report(job_id="j1", rank=0, world_size=1, batch_size=32, samples=int(samples),
                                            batches=int(samples) // 32, compute_s=clock.now - 1000.0))
        registry.measure({"j1": cpu})

    with caplog.at_level(logging.INFO, logger="controller.registry"):
        for _ in range(40):
            step(640.0)
        assert not [r for r in caplog.records if "changed phase" in r.message]
        for _ in range(40):
            step(320.0)
    changes = [r.getMessage() for r in caplog.records if "changed phase" in r.getMessage()]
    assert len(changes) == 1
    assert "a sample now costs 3.12 ms of CPU, 1.56 ms before" in changes[0]
