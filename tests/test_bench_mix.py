"""Benchmark mixes (schema, validation, seeded generator) and the scoring of runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.mix import DEFAULT_MIX, MIXES_DIR, PREDICTION_MIX, JobSpec, MixError, load_mix, mix_from_dict, random_mix
from bench.model_jobs import check_models, corpus_point, write_features
from bench.prediction_start import first_window_idle
from bench.report import (
    PlotUnavailable, busy_series, goal_sentences, headline, legend, phase_changes_s, plot, ratios, score_run,
    settle_times, summarise, table, worker_memory,
)
from bench.runner import JobOutcome, RunOutcome, job_command

GOOD_JOB = {
    "name": "a", "gpus": 2, "batch_size": 32, "compute_ms_per_batch": 50.0, "image_px": 224, "samples": 1000,
    "arrival_s": 0, "num_workers": 4, "io_bound": False,
}


@pytest.mark.parametrize("path", sorted(MIXES_DIR.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_mix_is_valid(path: Path) -> None:
    mix = load_mix(path)
    assert mix.jobs and mix.read_bps
    assert mix_from_dict(json.loads(json.dumps(mix.to_dict()))) == mix  # survives a round trip


def test_the_default_mix_is_a_dloader_like() -> None:
    mix = load_mix(DEFAULT_MIX)
    assert len({j.gpus for j in mix.jobs}) >= 3  # heterogeneous in GPUs
    assert len({j.image_px for j in mix.jobs if not j.io_bound}) >= 3  # and in CPU cost per sample
    assert sum(j.io_bound for j in mix.jobs) == 1
    assert len({j.arrival_s for j in mix.jobs}) >= 3  # jobs arrive across the run


def test_every_problem_is_reported_with_its_job_and_field(tmp_path: Path) -> None:
    bad = dict(GOOD_JOB, gpus=True, batch_size=0, colour="red")
    del bad["samples"]
    with pytest.raises(MixError) as error:
        mix_from_dict({"jobs": [GOOD_JOB, bad, dict(GOOD_JOB)]})
    message = str(error.value)
    for expected in ("jobs[1] (a)", "gpus must be int", "batch_size=0", "unknown field(s) ['colour']",
                     "missing ['samples']", "unique"):
        assert expected in message
    path = tmp_path / "mix.json"
    path.write_text("{not json")
    with pytest.raises(MixError, match="not JSON"):
        load_mix(path)
    with pytest.raises(MixError, match="cannot read"):
        load_mix(tmp_path / "missing.json")
    with pytest.raises(MixError, match="non-empty list"):
        mix_from_dict({"jobs": []})


def test_random_mixes_are_reproducible_heterogeneous_and_hold_one_reader() -> None:
    assert random_mix(3) == random_mix(3)
    assert random_mix(3) != random_mix(4)
    for seed in range(1, 11):
        mix = random_mix(seed)
        assert sum(j.io_bound for j in mix.jobs) == 1
        assert min(j.arrival_s for j in mix.jobs) == 0.0
        mix_from_dict(mix.to_dict())  # valid by the file schema too


def test_scaling_shortens_jobs_and_arrivals() -> None:
    mix = load_mix(DEFAULT_MIX)
    half = mix.scaled(0.5)
    for full, short in zip(mix.jobs, half.jobs):
        assert short.samples == max(full.batch_size, int(full.samples * 0.5))
        assert short.arrival_s == full.arrival_s * 0.5


def test_the_job_command_runs_bench_job_through_adloader_run() -> None:
    spec = JobSpec(**{**GOOD_JOB, "io_bound": True})
    command = job_command(spec, Path("/data"), Path("/t.json"))
    assert command[1:4] == ["-m", "adloader", "run"]
    assert ["--gpus", "2"] == command[command.index("--gpus"):command.index("--gpus") + 2]
    tail = command[command.index("--") + 1:]
    assert tail[1:3] == ["-m", "bench.job"] and "--io-bound" in tail


def test_a_job_dear_first_then_cheaper_changes_phase_and_loads_each_sample_as_its_phase_says() -> None:
    import time

    from bench.datasets import Phased

    spec = JobSpec(**{**GOOD_JOB, "phase_after_s": 10.0, "phase_cost": 1, "first_phase_cost": 3})
    assert spec.changes_phase and not JobSpec(**{**GOOD_JOB, "phase_after_s": 10.0, "phase_cost": 2,
                                                 "first_phase_cost": 2}).changes_phase
    tail = job_command(spec, Path("/data"), Path("/t.json"))
    assert tail[tail.index("--first-phase-cost") + 1] == "3" and tail[tail.index("--phase-cost") + 1] == "1"
    loads: list[int] = []

    class Counted:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            loads.append(index)
            return index

    for from_wall_s, expected in ((time.time() + 3600, 3), (time.time() - 1, 1)):
        loads.clear()
        assert Phased(Counted(), from_wall_s=from_wall_s, cost=1, first_cost=3)[2] == 2
        assert loads == [2] * expected


def test_first_phase_cost_is_validated_like_phase_cost() -> None:
    with pytest.raises(MixError, match="first_phase_cost"):
        mix_from_dict({"jobs": [{**GOOD_JOB, "phase_after_s": 1.0, "first_phase_cost": 0}]})


def test_a_job_that_evaluates_names_all_three_fields_and_passes_them_to_its_loop() -> None:
    evaluating = {**GOOD_JOB, "eval_every_steps": 50, "eval_batches": 20, "eval_compute_ms_per_batch": 10.0}
    spec = mix_from_dict({"jobs": [evaluating]}).jobs[0]
    assert spec.evaluates and not JobSpec(**GOOD_JOB).evaluates
    tail = job_command(spec, Path("/data"), Path("/t.json"))
    assert [tail[tail.index(flag) + 1] for flag in ("--eval-every-steps", "--eval-batches", "--eval-compute-ms")] == [
        "50", "20", "10.0"]
    with pytest.raises(MixError, match="go together"):
        mix_from_dict({"jobs": [{**GOOD_JOB, "eval_every_steps": 50}]})


# ---------------------------------------------------------------- scoring


def _outcome(name: str, gpus: int, arrival: float, ended: float, steps: list[tuple[float, float, float]],
             loop_start: float) -> JobOutcome:
    spec = JobSpec(**{**GOOD_JOB, "name": name, "gpus": gpus, "arrival_s": arrival})
    busy = sum(s[2] for s in steps)
    loop = steps[-1][0] + steps[-1][2]
    timeline = {"busy_s": busy, "loop_s": loop, "samples": 32 * len(steps), "steps": steps,
                "loop_start": loop_start, "process_start": loop_start - 2.5, "cpu_s": 1.0,
                "wait_s": sum(s[1] for s in steps), "sleep_overrun_s": 0.1}
    return JobOutcome(spec=spec, launched_s=arrival, ended_s=ended, exit_code=0, timeline=timeline)


def _run(policy: str, busy_a: float) -> RunOutcome:
    # job a: 4 GPUs, 10 steps of 1 s, each a wait then busy_a of compute; job b: 1 GPU, always busy
    steps_a = [(i + 1.0 - busy_a, 1.0 - busy_a, busy_a) for i in range(10)]
    steps_b = [(float(i), 0.0, 1.0) for i in range(5)]
    jobs = [_outcome("a", 4, 0.0, 11.0, steps_a, 1000.0), _outcome("b", 1, 2.0, 8.0, steps_b, 1002.0)]
    samples = [(0.0, {"a": {"cores": 2.0}}), (2.0, {"a": {"cores": 2.0}, "b": {"cores": 1.0}}),
               (2.5, {"a": {"cores": 1.5}, "b": {"cores": 0.5}}), (3.0, {"a": {"cores": 1.5}, "b": {"cores": 0.5}}),
               (8.0, {"a": {"cores": 2.0}})]
    return RunOutcome(policy=policy, repeat=0, started_at=1000.0, jobs=jobs, controller_cpu_s=0.2, wall_s=11.0,
                      samples=samples)


def test_a_run_is_scored_gpu_weighted() -> None:
    score = score_run(_run("adaptive", busy_a=0.5))
    # a: 4 GPUs busy 5 s of 10; b: 1 GPU busy 5 of 5 -> (4*5 + 5) / (4*10 + 5)
    assert score["gpu_busy"] == pytest.approx(25 / 45)
    assert score["makespan_s"] == 11.0
    assert score["mean_jct_s"] == pytest.approx((11.0 + 6.0) / 2)
    assert score["samples_per_s"] == pytest.approx(32 * 15 / 11.0)
    assert score["controller_cpu_pct"] == pytest.approx(100 * 0.2 / 11.0)
    assert score["jobs"]["b"]["busy_fraction"] == pytest.approx(1.0)
    # where a's GPU idled, apart: waiting for batches, waking late, starting
    assert score["jobs"]["a"]["wait_s"] == pytest.approx(5.0)
    assert score["jobs"]["a"]["sleep_overrun_s"] == pytest.approx(0.1)
    assert score["jobs"]["a"]["startup_s"] == pytest.approx(2.5)
    assert score["jobs"]["a"]["loop_s"] == pytest.approx(10.0)


def test_each_job_reports_its_costliest_worker_and_the_workers_its_memory_held_last() -> None:
    mib = 2**20
    samples = [(0.0, {"a": {"cores": 1.0}}),  # not measured yet
               (1.0, {"a": {"worker_memory_bytes": 300 * mib, "worker_prefetch_bytes": 20 * mib,
                            "worker_memory_exact": False, "workers_memory_limit": 40}}),
               (2.0, {"a": {"worker_memory_bytes": 120 * mib, "worker_prefetch_bytes": 8 * mib,
                            "worker_memory_exact": True, "workers_memory_limit": 6}}),
               (3.0, {"a": {"worker_memory_bytes": 140 * mib, "worker_prefetch_bytes": 10 * mib,
                            "worker_memory_exact": True, "workers_memory_limit": 5}, "b": {"cores": 1.0}})]
    # the exact reads win over the cheap upper bound read while the job had room to spare
    assert worker_memory(samples, "a") == {"per_worker_mib": 140.0, "prefetch_mib": 10.0, "exact": True,
                                           "workers_memory_limit": 5}
    assert worker_memory(samples[:2], "a") == {"per_worker_mib": 300.0, "prefetch_mib": 20.0, "exact": False,
                                               "workers_memory_limit": 40}
    assert worker_memory(samples[:3], "a")["workers_memory_limit"] == 6
    assert worker_memory(samples, "b") is None
    assert score_run(_run("adaptive", busy_a=0.5))["jobs"]["a"]["worker_memory"] is None  # no sample measured it


def test_settling_is_measured_from_each_change_of_the_job_set() -> None:
    # b arrives at 2.0 and the cores have their final values from the sample at 2.5 on;
    # a alone again at 8.0 is settled at once
    assert settle_times(_run("adaptive", 0.5)) == [0.5, 0.0]


def test_a_registering_job_is_an_event_of_its_own() -> None:
    # a reports at 0; b registers at 6 (an even share for both at once), reports at 8, and
    # the plan settles at 9: a's arrival settled at once, b's registration too, b's report at 9
    a, b = {"cores": 2.0, "state": "running"}, {"cores": 1.0, "state": "starting"}
    samples = [(0.0, {"a": a}), (3.0, {"a": a}), (6.0, {"a": {**a, "cores": 1.0}, "b": b}),
               (7.0, {"a": {**a, "cores": 1.0}, "b": b}), (8.0, {"a": {**a, "cores": 1.0}, "b": {**b, "state": "running"}}),
               (8.5, {"a": {**a, "cores": 0.5}, "b": {"cores": 1.5, "state": "running"}}),
               (9.0, {"a": {**a, "cores": 0.5}, "b": {"cores": 1.5, "state": "running"}})]
    run = RunOutcome(policy="adaptive", repeat=0, started_at=0.0, jobs=[], controller_cpu_s=0.0, wall_s=9.0,
                     samples=[(0.0, {})] + samples)
    assert settle_times(run) == [0.0, 0.0, 0.5]


def test_a_phase_change_is_an_event_of_its_own() -> None:
    # a changes phase 5 s after its process started (at 1 s): the plan that follows it at 7 s
    # is the phase's settling, not the arrival's (settled at once); counted, as every event is,
    # from the first status sample that could show it (6.5 s)
    spec = JobSpec(name="a", gpus=1, batch_size=32, compute_ms_per_batch=50.0, image_px=64, samples=320,
                   arrival_s=0.0, num_workers=2, phase_after_s=5.0, phase_cost=2)
    a = JobOutcome(spec=spec, launched_s=0.5, ended_s=9.0, exit_code=0, timeline={"process_start": 101.0})
    before, after = {"cpu_weight": 100, "state": "running"}, {"cpu_weight": 1100, "state": "running"}
    samples = [(0.0, {}), (1.0, {"a": before}), (4.0, {"a": before}), (6.5, {"a": before}), (7.0, {"a": after}),
               (9.0, {"a": after})]
    run = RunOutcome(policy="adaptive", repeat=0, started_at=100.0, jobs=[a], controller_cpu_s=0.0, wall_s=9.0,
                     samples=samples)
    assert phase_changes_s(run) == [6.0]
    assert settle_times(run) == [0.0]
    assert settle_times(run, after_phases=True) == [0.5]
    assert score_run(run)["phase_settle_s"] == 0.5


def test_busy_series_follows_the_compute_intervals() -> None:
    steps = [(0.0, 0.0, 1.0), (1.0, 0.0, 0.5), (2.0, 0.5, 0.5)]
    xs, ys = busy_series({"steps": steps}, offset_s=10.0, window_s=1.0, step_s=1.0)
    assert xs[0] == pytest.approx(10.5)
    assert ys[0] == pytest.approx(1.0)  # [10, 11): computing throughout
    assert ys[1] == pytest.approx(0.5)  # [11, 12): half


def test_medians_ratios_and_the_table() -> None:
    runs = [_run("even", 0.25), _run("adaptive", 0.5), _run("even", 0.25), _run("adaptive", 0.75)]
    summary = summarise(runs)
    assert summary["adaptive"]["gpu_busy"] == pytest.approx((25 / 45 + 35 / 45) / 2)
    rel = ratios(summary)
    assert rel["adaptive"]["vs_even"]["gpu_busy"] == pytest.approx(summary["adaptive"]["gpu_busy"] / (15 / 45))
    assert "even" not in rel or "vs_even" not in rel["even"]
    text = table(summary, ["even", "adaptive"])
    assert "GPU-emulated" in text and "adaptive" in text and "busy/even" in text
    assert text.splitlines()[0] == "GPU-emulated node benchmark (medians over 2 runs per policy)"
    one = table(summarise([_run("even", 0.25), _run("adaptive", 0.5)]), ["even", "adaptive"])
    assert one.splitlines()[0] == "GPU-emulated node benchmark (one run per policy)"


def test_the_demo_says_what_adaptive_did_in_a_sentence_and_each_goal_in_words() -> None:
    document = {"ratios": {"adaptive": {"vs_even": {"gpu_busy": 1.513, "makespan_s": 0.68}}},
                "goals": {"adaptive_vs_even_gpu_busy": {"value": 1.513, "bar": ">= 1.3", "met": True},
                          "adaptive_settle_s": {"value": 6.5, "bar": "<= 5", "met": False}}}
    assert headline(document) == "adaptive kept the GPUs 1.51x as busy as even and finished 32% sooner (GPU-emulated)"
    slower = {"ratios": {"adaptive": {"vs_even": {"gpu_busy": 0.9, "makespan_s": 1.1}}}}
    assert headline(slower) == "adaptive kept the GPUs 0.90x as busy as even and took 10% longer (GPU-emulated)"
    assert headline({"ratios": {}}) is None
    assert goal_sentences(document) == [
        "met: adaptive's GPUs busier than even's: 1.51x, asked >= 1.3x",
        "missed: adaptive settles after an arrival or departure, in seconds: 6.50s, asked <= 5s",
    ]
    words = "\n".join(legend(["even"]))
    for column in ("GPU busy", "samples/s", "makespan", "mean JCT", "ctl CPU", "ctl wait", "settle", "chg/job-min",
                   "busy/even", "mkspan/even"):
        assert f"{column}:" in words or f"{column}," in words or f" {column}:" in words, column


# ---------------------------------------------------------------- jobs that name a model


def test_the_prediction_mix_names_corpus_models_and_emulates_their_measured_steps(tmp_path: Path) -> None:
    mix = load_mix(PREDICTION_MIX)
    check_models(mix)
    for spec in mix.jobs:
        point = corpus_point(spec)
        assert spec.compute_ms_per_batch == pytest.approx(1000 * point["step_s"], abs=0.05)
        features = json.loads(write_features(spec, tmp_path).read_text())
        assert features == point["features"] and features["batch_size"] == spec.batch_size
        command = job_command(spec, Path("/data"), Path("/t.json"), tmp_path / f"{spec.name}.features.json")
        head = command[:command.index("--")]
        assert head[head.index("--model-features") + 1] == str(tmp_path / f"{spec.name}.features.json")


def test_a_model_the_corpus_lacks_is_refused_with_the_choices() -> None:
    mix = mix_from_dict({"jobs": [dict(GOOD_JOB, model="resnet-9000")]})
    with pytest.raises(MixError, match=r"model 'resnet-9000' at batch 32 is not in the .*corpus; pick one of"):
        check_models(mix)


def test_first_window_idle_counts_compute_inside_the_window_only() -> None:
    # Steps at 0, 10, 20, 40 s of 5 s compute each; a 30 s window holds 15 s of compute.
    timeline = {"loop_s": 45.0, "steps": [[0.0, 0.0, 5.0], [10.0, 5.0, 5.0], [20.0, 5.0, 5.0], [40.0, 15.0, 5.0]]}
    assert first_window_idle(timeline, 30.0) == pytest.approx(0.5)
    # A step straddling the window's end counts up to the end; a short job is judged on its loop.
    assert first_window_idle({"loop_s": 45.0, "steps": [[28.0, 0.0, 5.0]]}, 30.0) == pytest.approx(1 - 2 / 30)
    assert first_window_idle({"loop_s": 10.0, "steps": [[0.0, 0.0, 5.0]]}, 30.0) == pytest.approx(0.5)
    assert first_window_idle({"loop_s": 10.0, "steps": []}, 30.0) is None


def test_without_matplotlib_the_plot_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is not installed
    with pytest.raises(PlotUnavailable, match=r"matplotlib is not installed; pip install 'adloader\[plot\]'"):
        plot(tmp_path / "x.png", [], ["even"], "title")
    assert not (tmp_path / "x.png").exists()


def test_the_random_summary_judges_every_mix_by_the_issue_goals() -> None:
    from bench.node import random_summary

    def mix(vs_static: float, vs_even: float, settles: list[float]) -> dict:
        return {"ratios": {"adaptive": {"vs_static": {"gpu_busy": vs_static}, "vs_even": {"gpu_busy": vs_even}}},
                "policies": {"adaptive": {"repeats": [{"settle_s": s} for s in settles]}}}

    summary = random_summary([mix(1.2, 1.3, [1.0, 2.0]), mix(0.97, 1.1, [4.0, 6.5]), mix(1.04, 1.0, [0.5, 0.5])],
                             planned=20)
    goals = summary["goals"]
    assert goals["worst_vs_static"] == {"value": 0.97, "bar": ">= 0.98", "met": False}
    assert goals["worst_vs_even"]["met"] and goals["worst_vs_even"]["value"] == 1.0
    assert goals["median_vs_static"] == {"value": 1.04, "bar": ">= 1.05", "met": False}
    assert goals["slowest_settle_s"] == {"value": 6.5, "bar": "<= 5", "met": False}
    assert (summary["mixes_done"], summary["mixes_planned"]) == (3, 20)
    assert sum("MISSED" in line for line in summary["verdicts"]) == 3


def test_the_phase_goal_is_judged_against_the_best_static_split_that_ran_too() -> None:
    from bench.node import goal_lines, goals

    phased_mix = load_mix(MIXES_DIR / "crossing_pair_sharp.json").to_dict()

    def document(**busy: float) -> dict:
        policies = {name: {"gpu_busy": value, "settle_s": 0.0} for name, value in busy.items()}
        versus = {f"vs_{name}": {"gpu_busy": busy["adaptive"] / value}
                  for name, value in busy.items() if name != "adaptive"}
        return {"mix": phased_mix, "policies": policies, "ratios": {"adaptive": versus}}

    # the node's run of 2026-11-28: even's placement beat the searched split
    judged = goals(document(static=0.380, even=0.453, adaptive=0.405, oracle=0.378))
    assert judged["adaptive_vs_oracle_gpu_busy"]["met"]
    assert judged["adaptive_vs_best_static_split_gpu_busy"] == {
        "value": pytest.approx(0.405 / 0.453), "bar": ">= 1.05", "met": False, "against": "even"}
    lines = goal_lines({"goals": judged})
    assert any(line.startswith("goal adaptive_vs_best_static_split_gpu_busy (even): 0.894")
               and line.endswith("MISSED") for line in lines)
    # where the search is the best, the two goals agree
    judged = goals(document(static=0.30, even=0.32, adaptive=0.40, oracle=0.36))
    assert judged["adaptive_vs_best_static_split_gpu_busy"]["against"] == "oracle"
    assert judged["adaptive_vs_best_static_split_gpu_busy"]["value"] == pytest.approx(0.40 / 0.36)
    # no oracle in the run, no best static split to judge against
    assert "adaptive_vs_best_static_split_gpu_busy" not in goals(document(static=0.3, even=0.3, adaptive=0.4))
