"""The node model of bench/sim_node.py and the measured inputs bench/replay.py gives it.

Pure: simulated clock, no sleeping. What is checked is the model's mechanics (a starting
job is not seen, costs CPU, and is not in its busy fraction's wall; JPEG costs between
the measured sides), not any figure of the report.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from bench.sim_node import MAIN_PROCESS_CORES, STARTUP_CORES, SimJob, SimNode, oversubscription_inflation, simulate
from bench.replay import MEASURED_COST_S, jobs_from_measured_mix, jpeg_cost_s, measured_node
from bench.simulate import settle_times
from controller.policies import make_policy
from controller.policies.base import Allocation, JobView, NodeResources


class _Recording:
    """The static policy, remembering which jobs each step showed it."""

    name = "static"

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []
        self._static = make_policy("static")

    def allocate(self, node: NodeResources, jobs: list[JobView]) -> Allocation:
        self.seen.append(tuple(sorted(job.name for job in jobs)))
        return self._static.allocate(node, jobs)


def test_a_starting_job_is_not_seen_costs_cpu_and_is_not_in_its_busy_wall() -> None:
    node = SimNode(cores=1, period_s=1.0, settle_period_s=1.0)  # one step a second throughout
    # "hungry" needs two cores: it takes every cycle the starting job's process leaves it
    hungry = SimJob(name="hungry", gpus=1, max_throughput=200.0, cpu_s_per_sample=0.01, samples=200.0 * 60,
                    requested_workers=4)
    late = SimJob(name="late", gpus=1, max_throughput=10.0, cpu_s_per_sample=0.001, samples=100.0,
                  arrival_s=10.0, startup_s=5.0)
    policy = _Recording()
    result = simulate(node, [hungry, late], policy, seed=1)
    first_seen = next(n for n, names in enumerate(policy.seen) if "late" in names)
    assert first_seen == 15  # arrival 10 s + start-up 5 s, one step a second
    alone = simulate(node, [hungry], make_policy("static"), seed=1)
    # while "late" started, its process took STARTUP_CORES of the one core at the same weight:
    # half of it for five steps, 2.5 core-seconds, 2.5 s of "hungry" at 100 samples/s a core
    assert STARTUP_CORES >= 0.5
    assert 2.0 <= result.jobs["hungry"]["jct_s"] - alone.jobs["hungry"]["jct_s"] <= 4.0
    assert result.jobs["late"]["jct_s"] >= 5.0 + result.jobs["late"]["wall_s"] - 1e-9


def test_jpeg_costs_pass_through_the_measured_sides_and_lie_between_them() -> None:
    for side, cost in MEASURED_COST_S.items():
        assert jpeg_cost_s(side) == pytest.approx(cost)
    assert MEASURED_COST_S[96] < jpeg_cost_s(160) < MEASURED_COST_S[224]
    # a fixed part per sample: 160 px costs more than its pixels at 224 px's rate, less than at 96 px's
    assert MEASURED_COST_S[224] * (160 / 224) ** 2 < jpeg_cost_s(160) < MEASURED_COST_S[96] * (160 / 96) ** 2
    assert jpeg_cost_s(640) > MEASURED_COST_S[512]


def test_a_python_bound_loader_takes_only_the_cores_it_can_use() -> None:
    node = SimNode(cores=4, period_s=1.0)
    # the Python-bound job could use 4 cores for its M but delivers at most 100 samples/s (1 core)
    # (one worker per core in all: no oversubscription cost)
    bound = SimJob(name="bound", gpus=1, max_throughput=400.0, cpu_s_per_sample=0.01, samples=100.0 * 60,
                   requested_workers=1, concavity=0.0, python_cap=100.0)
    hungry = SimJob(name="hungry", gpus=1, max_throughput=400.0, cpu_s_per_sample=0.01, samples=300.0 * 60,
                    requested_workers=3, concavity=0.0)
    result = simulate(node, [bound, hungry], make_policy("static"), seed=1)
    # at equal weights the kernel would split 2:2 if both spun; "bound" leaves 3 cores to "hungry"
    assert result.jobs["hungry"]["busy_s"] / result.jobs["hungry"]["wall_s"] == pytest.approx(0.75, abs=0.01)


def test_a_training_loops_python_work_is_neither_under_its_jobs_quota_nor_its_loading_cost() -> None:
    """The controller keeps a training process apart from its job's CPU group: under ``even``'s
    quota of one core a job whose training loop costs 4 ms of Python a sample beside 1 ms of
    loading still gets its 0.2 loading cores and runs at full speed (200 samples/s); the same
    5 ms charged to its loaders needs its whole quota, which a quota's throttling makes less."""
    node = SimNode(cores=2, period_s=1.0)
    python = SimJob(name="python", gpus=1, max_throughput=200.0, cpu_s_per_sample=0.001, samples=200.0 * 30,
                    requested_workers=1, concavity=0.0, trainer_s_per_sample=0.004)
    hungry = SimJob(name="hungry", gpus=1, max_throughput=4000.0, cpu_s_per_sample=0.001, samples=1000.0 * 30,
                    requested_workers=1, concavity=0.0)
    busy = {}
    for job in (python, dataclasses.replace(python, cpu_s_per_sample=0.005, trainer_s_per_sample=0.0)):
        result = simulate(node, [job, hungry], make_policy("even"), seed=1)
        busy[job.trainer_s_per_sample > 0] = result.jobs["python"]["busy_s"] / result.jobs["python"]["wall_s"]
    assert busy[True] == pytest.approx(1.0, abs=0.02)
    assert busy[False] < 0.95


def test_a_crossing_mix_oversubscribes_the_node_and_moves_every_job_to_another_phase() -> None:
    from bench.simulate import CROSSING_FACTORS, crossing_mix

    jobs = crossing_mix(64, 8, seed=3)
    assert sum(job.max_throughput * job.cpu_s_per_sample for job in jobs) >= 64  # full speed needs more than the node
    assert [job.phases[0][1] for job in jobs] == [CROSSING_FACTORS[i % 2] for i in range(8)]
    for job in jobs:
        (start, _), = job.phases
        duration = job.samples / job.max_throughput
        assert 0.3 * duration <= start <= 0.6 * duration
    assert crossing_mix(64, 8, seed=3) == jobs  # seeded


def test_a_two_core_phase_mix_oversubscribes_the_node_and_makes_one_or_two_jobs_dearer_mid_run() -> None:
    from bench.simulate import PHASE_COSTS, two_core_phase_mix

    for seed in range(1, 11):
        jobs = two_core_phase_mix(2, 3, seed)
        assert len(jobs) == 3 and two_core_phase_mix(2, 3, seed) == jobs  # seeded
        load = sum(j.max_throughput * j.cpu_s_per_sample for j in jobs)
        floors = sum(20.0 * j.gpus * j.cpu_s_per_sample for j in jobs)  # the slowest job a mix has
        assert 2.0 <= load <= 4.0 + floors
        phased = [j for j in jobs if j.phases]
        assert 1 <= len(phased) <= 2
        for job in phased:
            ((start, cost),) = job.phases
            full_speed_s = job.samples / job.max_throughput
            assert cost in PHASE_COSTS and 0.3 * full_speed_s <= start <= 0.6 * full_speed_s


def test_a_crossing_pair_swaps_its_cheap_job_half_way_and_is_cpu_bound_in_both_phases() -> None:
    from bench.simulate import CROSSING_PAIRS, crossing_pair

    for need, factor in CROSSING_PAIRS:
        cheap_first, dear_first = crossing_pair(need, factor)
        assert cheap_first.max_throughput == dear_first.max_throughput and cheap_first.samples == dear_first.samples
        half_way = cheap_first.samples / cheap_first.max_throughput / 2
        for age, cheap, dear in ((half_way - 1, cheap_first, dear_first), (half_way + 1, dear_first, cheap_first)):
            assert dear.cost(age) == pytest.approx(factor * cheap.cost(age))
            full_speed = cheap.max_throughput
            assert cheap.cores_for(full_speed, age) == pytest.approx(need, rel=0.02)
            assert cheap.cores_for(full_speed, age) + dear.cores_for(full_speed, age) > 2  # the node is short


def test_more_workers_per_core_make_every_sample_dearer() -> None:
    """A loading-bound job alone on two cores: with 16 workers its samples cost what eight
    workers per core cost (the fitted inflation), with two it delivers two cores' worth."""
    assert oversubscription_inflation(2, 2) == 1.0 == oversubscription_inflation(1, 4)
    assert 1.0 < oversubscription_inflation(8, 2) < oversubscription_inflation(32, 2)
    node = SimNode(cores=2, period_s=1.0, rate_noise=0.0, cpu_noise=0.0)

    def busy(workers: int) -> float:
        job = SimJob(name="j", gpus=1, max_throughput=1000.0, cpu_s_per_sample=0.004, samples=500.0 * 120,
                     requested_workers=workers, concavity=0.0)
        result = simulate(node, [job], make_policy("static"), seed=1)
        return result.jobs["j"]["busy_s"] / result.jobs["j"]["wall_s"]

    assert busy(2) == pytest.approx(0.5, rel=0.01)  # 2 cores / 4 ms = 500 of 1000 samples/s
    assert busy(16) == pytest.approx(0.5 / oversubscription_inflation(16, 2), rel=0.01)


def test_a_job_whose_samples_suffer_more_from_crowding_is_slowed_more_by_the_same_workers() -> None:
    """A loading-bound job alone on two cores with sixteen workers: one of large images, losing
    0.2 per e-fold of workers per core, is slowed by that, one losing 0.05 by that."""
    node = SimNode(cores=2, period_s=1.0, rate_noise=0.0, cpu_noise=0.0)

    def busy(cost: float) -> float:
        job = SimJob(name="j", gpus=1, max_throughput=1000.0, cpu_s_per_sample=0.004, samples=500.0 * 120,
                     requested_workers=16, concavity=0.0, oversubscription_cost=cost)
        result = simulate(node, [job], make_policy("static"), seed=1)
        return result.jobs["j"]["busy_s"] / result.jobs["j"]["wall_s"]

    assert oversubscription_inflation(16, 2, 0.2) == pytest.approx(1 + 0.2 * math.log(8))
    assert busy(0.2) == pytest.approx(0.5 / oversubscription_inflation(16, 2, 0.2), rel=0.01)
    assert busy(0.05) == pytest.approx(0.5 / oversubscription_inflation(16, 2, 0.05), rel=0.01)


def test_the_real_node_mix_is_replayed_with_its_phase_and_its_python_work() -> None:
    """bench/mixes/real_node.json in the model: the phased job's cost doubles 25 s after its
    process starts (as bench/job.py does), and the job with 35 ms of Python per 40 ms step
    never runs more than a batch per 75 ms, whatever its loader's cores."""
    mix = json.loads((Path(__file__).resolve().parents[1] / "bench" / "mixes" / "real_node.json").read_text())
    jobs, node = jobs_from_measured_mix({"mix": mix, "node": {"read_bps": 6e8}})
    by_name = {job.name: job for job in jobs}
    assert node.read_bps == 6e8
    assert by_name["resnet-phase-2g"].phases == ((25.0, 2.0),)
    assert by_name["resnet-phase-2g"].cost(30.0) == pytest.approx(2 * by_name["resnet-phase-2g"].cost(10.0))
    assert by_name["pybound-1g"].python_cap == pytest.approx(32 / 0.075)
    assert by_name["pybound-1g"].trainer_s_per_sample == pytest.approx(0.035 / 32)
    assert by_name["pybound-1g"].cpu_s_per_sample == pytest.approx(jpeg_cost_s(96))
    assert all(job.python_cap == float("inf") for name, job in by_name.items() if name != "pybound-1g")


def test_jobs_declare_their_remaining_samples_so_jct_and_adaptive_serve_the_shortest_first() -> None:
    """As ``adloader run --samples`` does: the views carry what is left, and ``jct`` (ranks in
    remaining time) finishes four same-shape jobs of lengths 1:2:4:8 in order, the shortest well
    before its even-share time; ``adaptive`` (a job clearly behind another in remaining time per
    GPU counts half) serves them in order too; ``even`` ignores their lengths."""
    shaped = dict(gpus=1, max_throughput=800.0, cpu_s_per_sample=0.00325, batch_size=32, requested_workers=1)
    jobs = [SimJob(name=f"len{n}", samples=3200.0 * n, **shaped) for n in (1, 2, 4, 8)]  # type: ignore[arg-type]
    node = SimNode(cores=2)
    even = simulate(node, jobs, make_policy("even"), seed=0).jobs
    for policy in ("jct", "adaptive"):
        served = simulate(node, jobs, make_policy(policy), seed=0).jobs
        assert sorted(served, key=lambda name: served[name]["jct_s"]) == ["len1", "len2", "len4", "len8"], policy
        assert served["len1"]["jct_s"] < 0.75 * even["len1"]["jct_s"], policy
        assert sum(j["jct_s"] for j in served.values()) < sum(j["jct_s"] for j in even.values()), policy


@pytest.mark.parametrize("seed", range(4))
def test_jobs_ordered_by_length_get_their_plan_once_not_again_when_their_curves_mature(seed: int) -> None:
    """Four same-shape jobs of lengths 1:2:4:8 starting together: their curves are pooled as
    equals while young, and the shortest's priority must not wait for them to mature (it did:
    re-planned 5.5 to 12 s after the start in the simulator, 5.2 and 7.3 s measured)."""
    shaped = dict(gpus=1, max_throughput=800.0, cpu_s_per_sample=0.00325, batch_size=32, requested_workers=4)
    jobs = [SimJob(name=f"len{n}", samples=3200.0 * n, **shaped) for n in (1, 2, 4, 8)]  # type: ignore[arg-type]
    result = simulate(SimNode(cores=2), jobs, make_policy("adaptive"), seed=seed)
    assert max(settle_times(result)) <= 5.0


def test_a_reader_with_more_reads_in_flight_reads_what_the_measured_disk_gives_them() -> None:
    """The simulated disk follows the curve bench/disk_readers.py measured: interpolated
    between its points, flat beyond them; one reader alone reads what the disk gives its
    workers, and fewer workers read faster on a disk like this VM's."""
    curve = ((1, 800e6), (2, 700e6), (4, 600e6))
    node = SimNode(cores=2, disk_bps=650e6, disk_curve=curve, period_s=1.0, settle_period_s=1.0)
    assert [node.disk_bandwidth(n) for n in (0, 1, 3, 4, 9)] == pytest.approx([800e6, 800e6, 650e6, 600e6, 600e6])
    assert SimNode(cores=2, disk_bps=650e6).disk_bandwidth(8) == 650e6
    busy = {}
    for workers in (1, 4):
        # 1 MB a sample, 2000 samples/s at full speed: the disk, not its cores, holds it back
        reader = SimJob(name="reader", gpus=1, max_throughput=2000.0, cpu_s_per_sample=0.0001, samples=2000.0 * 30,
                        requested_workers=workers, bytes_per_sample=1e6, concavity=0.0, startup_s=0.0)
        job = simulate(node, [reader], make_policy("static"), seed=1).jobs["reader"]
        busy[workers] = job["busy_s"] / job["wall_s"]
    assert busy[1] == pytest.approx(800e6 / 1e6 / 2000.0, rel=0.02)
    assert busy[4] == pytest.approx(600e6 / 1e6 / 2000.0, rel=0.02)


def test_a_job_whose_loader_keeps_up_loses_its_fetch_time_to_its_step_and_more_on_a_crowded_node() -> None:
    """The fetch no prefetching hides: a job whose loader has data to spare is busy
    step / (step + batch x fetch per sample), the fetch growing with workers per core; a job
    its loader holds back is not slowed by it."""
    node = SimNode(cores=4, period_s=1.0, settle_period_s=1.0, rate_noise=0.0, cpu_noise=0.0,
                   fetch_s_per_sample=0.1e-3, fetch_contention_s_per_sample=0.02e-3)

    def busy(workers: int, cpu_s_per_sample: float) -> float:
        # 32-sample batches, a 100 ms step: M = 320 samples/s
        job = SimJob(name="j", gpus=1, max_throughput=320.0, cpu_s_per_sample=cpu_s_per_sample,
                     samples=320.0 * 60, requested_workers=workers, batch_size=32, concavity=0.0)
        result = simulate(node, [job], make_policy("static"), seed=1).jobs["j"]
        return result["busy_s"] / result["wall_s"]

    assert busy(4, 0.001) == pytest.approx(0.1 / (0.1 + 32 * (0.1e-3 + 0.02e-3 * 1)), rel=0.005)
    assert busy(16, 0.001) == pytest.approx(0.1 / (0.1 + 32 * (0.1e-3 + 0.02e-3 * 4)), rel=0.005)
    # two workers and the main process: 2.2 cores give 220 of 320 samples/s
    assert busy(2, 0.01) == pytest.approx((2 + MAIN_PROCESS_CORES) / 0.01 / 320.0, rel=0.005)


def _run(policy_runs: dict[str, list[dict]], jobs: list[dict]) -> dict:
    """A measured run document as bench/node.py writes it, with only what the replay reads."""
    return {"mix": {"name": "fixture", "jobs": jobs}, "node": {"period_s": 1.0},
            "policies": {policy: {"gpu_busy": 0.5, "repeats": repeats} for policy, repeats in policy_runs.items()}}


def _repeat(allocations: dict[str, list], figures: dict[str, dict]) -> dict:
    """One repeat: the allocation (cores, weight, workers, read_bps, state) held for 10 s."""
    return {"allocations": [[0.0, allocations], [10.0, allocations]], "jobs": figures}


def test_replayed_jobs_cost_what_their_runs_measured_less_each_runs_oversubscription() -> None:
    from bench.replay import job_cpu_costs, oversubscription_cost, workers_per_core

    plain = {"name": "plain", "gpus": 1, "batch_size": 32, "compute_ms_per_batch": 100.0, "image_px": 224,
             "samples": 3200, "arrival_s": 0.0, "num_workers": 4}
    # twice as dear from 5 s after its start, 2 s into a 10 s loop (STARTUP_S = 3): a fifth of its
    # samples at 1 ms, the rest at 2 ms, 1.8 ms on average
    phased = {**plain, "name": "phased", "phase_after_s": 5.0, "phase_cost": 2}
    python = {**plain, "name": "python", "python_ms_per_batch": 16.0}
    crowded = oversubscription_inflation(12, 2, oversubscription_cost(plain))  # 3 x 4 workers on the 2 cores
    static = _repeat({name: [None, None, None, None, "running"] for name in ("plain", "phased", "python")},
                     {"plain": {"loader_cpu_s": 3200 * 0.002 * crowded, "samples": 3200},
                      "phased": {"loader_cpu_s": 3200 * 0.0018 * crowded, "samples": 3200, "loop_s": 10.0},
                      "python": {"loader_cpu_s": 9.0, "samples": 3200}})
    even = _repeat({name: [1.0, None, 1, None, "running"] for name in ("plain", "phased")}
                   | {"python": [0.0, None, 0, None, "running"]},
                   {"plain": {"loader_cpu_s": 3200 * 0.002, "samples": 3200},
                    "phased": {"loader_cpu_s": 3200 * 0.0018, "samples": 3200, "loop_s": 10.0},
                    "python": {"loader_cpu_s": 9.0, "samples": 3200}})
    specs = {"plain": plain, "phased": phased, "python": python}
    document = _run({"static": [static], "even": [even]}, list(specs.values()))
    assert workers_per_core(static, specs) == pytest.approx(6.0)
    assert workers_per_core(even, specs) == pytest.approx(1.0)
    # a phased job costs its first phase's; Python work in a training loop is not a loading cost
    assert job_cpu_costs(document) == {"plain": pytest.approx(0.002), "phased": pytest.approx(0.001)}
    jobs = {job.name: job for job in jobs_from_measured_mix(document)[0]}
    assert {name: job.cpu_s_per_sample for name, job in jobs.items()} == {
        "plain": pytest.approx(0.002), "phased": pytest.approx(0.001), "python": pytest.approx(jpeg_cost_s(224))}
    assert jobs["python"].trainer_s_per_sample == pytest.approx(0.016 / 32)
    assert jobs["plain"].trainer_s_per_sample == jobs["phased"].trainer_s_per_sample == 0.0


def test_the_oversubscription_cost_by_side_is_the_slope_over_the_intercept_of_its_runs() -> None:
    """Runs of a 224 px job at 1 to 8 workers per core costing 1.1·(1 + 0.2·ln(workers per
    core)) times the side's cost, and a 96 px job's too few runs to fit: the fit gives 224 px
    0.2 and leaves 96 px out; a replayed job is planned with its side's figure."""
    from bench.replay import OVERSUBSCRIPTION_COST_BY_SIDE, fit_oversubscription, oversubscription_cost

    def job(side: int) -> dict:
        return {"name": f"j{side}", "gpus": 1, "batch_size": 32, "compute_ms_per_batch": 100.0, "image_px": side,
                "samples": 1000, "arrival_s": 0.0, "num_workers": 2}

    def repeat(side: int, workers: int) -> dict:
        cost = MEASURED_COST_S[side] * 1.1 * (1 + 0.2 * math.log(workers / 2))
        return _repeat({f"j{side}": [None, None, workers, None, "running"]},
                       {f"j{side}": {"loader_cpu_s": 1000 * cost, "samples": 1000}})

    documents = [_run({"static": [repeat(224, w) for w in range(2, 17)]}, [job(224)]),
                 _run({"static": [repeat(96, w) for w in (2, 4, 8)]}, [job(96)])]
    assert fit_oversubscription(documents) == {224: pytest.approx(0.2)}
    assert oversubscription_cost(job(448)) == OVERSUBSCRIPTION_COST_BY_SIDE[448]
    assert oversubscription_cost(job(400)) == OVERSUBSCRIPTION_COST_BY_SIDE[448]  # nearest by pixels
    jobs, _ = jobs_from_measured_mix(_run({"static": [repeat(224, 2)]}, [job(224)]))
    assert jobs[0].oversubscription_cost == OVERSUBSCRIPTION_COST_BY_SIDE[224]


def test_the_quota_response_is_the_busy_reached_against_quota_over_the_cores_its_rate_needs() -> None:
    from bench.replay import quota_response

    # M = 320 samples/s at 1 ms a sample: 0.32 cores at full speed
    spec = {"name": "j", "gpus": 1, "batch_size": 32, "compute_ms_per_batch": 100.0, "image_px": 224,
            "samples": 3200, "arrival_s": 0.0, "num_workers": 1}
    runs = [_repeat({"j": [quota, None, 1, None, "running"]},
                    {"j": {"loader_cpu_s": 3.2, "samples": 3200, "busy_fraction": busy}})
            for quota, busy in ((0.16, 0.45), (0.64, 0.99))]
    table = quota_response([_run({"even": runs, "static": runs}, [spec])], fetch_s=0.0, contention_s=0.0)
    assert table == ((0.0, 0.0), (0.5, 0.45), (2.0, 0.99))  # static runs have no quota to learn from


def test_a_job_a_phase_makes_cpu_bound_is_not_served_first_for_being_short_at_full_speed() -> None:
    """Simulated 2-core phase mix 2-51 (bench/simulate.py): a 4-GPU job, the shortest per GPU at
    full speed, gets 4x dearer mid-run and then needs 14 cores; ranked by its length at full
    speed it kept the 1-GPU job beside it at weight 10 and one worker for 400 s, where static
    finished that job in 82 s (adaptive 0.83x static). Ranked at the rate the whole node gives
    it, it no longer counts as the shorter one."""
    node = measured_node(period_s=1.0, settle_period_s=0.5)
    jobs = [SimJob(name="four-gpus", gpus=4, max_throughput=782.0, cpu_s_per_sample=0.00448, samples=53_937.0,
                   requested_workers=2, batch_size=32, startup_s=3.0, phases=((39.0, 4.0),)),
            SimJob(name="one-gpu", gpus=1, max_throughput=478.0, cpu_s_per_sample=0.00089, samples=24_385.0,
                   requested_workers=4, batch_size=32, startup_s=3.0, phases=((25.4, 4.0),))]
    static = simulate(node, jobs, make_policy("static"), seed=51)
    adaptive = simulate(node, jobs, make_policy("adaptive"), seed=51)
    assert adaptive.gpu_busy >= 0.98 * static.gpu_busy
    assert adaptive.jobs["one-gpu"]["jct_s"] < 2 * static.jobs["one-gpu"]["jct_s"]


def test_settle_after_a_phase_change_is_counted_apart_from_arrivals_and_departures() -> None:
    """As the node benchmark counts ``settle_s`` and ``phase_settle_s`` (bench/report.py): the
    issue's settle goal is after arrivals and departures; what follows a phase is reported apart."""
    jobs = [SimJob(name=name, gpus=1, max_throughput=200.0, cpu_s_per_sample=0.005, samples=200.0 * 40,
                   requested_workers=2, phases=phases)
            for name, phases in (("steady", ()), ("phased", ((15.0, 3.0),)))]
    result = simulate(SimNode(cores=2), jobs, make_policy("adaptive"), seed=0)
    assert len(result.phase_events) == 1 and result.phase_events <= set(result.events)
    assert len(settle_times(result, after_phases=True)) == 1
    assert len(settle_times(result)) == len(result.events) - 1
