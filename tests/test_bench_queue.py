"""Jobs queueing for the node's GPUs in the benchmark and the simulator (a mix's ``"gpus"``):
first come first served, completion counted from arrival, what waits handed to the controller
in the format it reads (controller/pending_queue.py), and the shipped queueing mixes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.gpu_queue import starting_now
from bench.mix import MIXES_DIR, JobSpec, MixError, load_mix, mix_from_dict
from bench.replay import jobs_from_measured_mix
from bench.report import score_run
from bench.runner import JobOutcome, RunOutcome, free_gpus, write_pending
from bench.sim_node import SimJob, SimNode, simulate
from bench.simulate import mix_figures
from controller.pending_queue import FileQueue
from controller.policies import make_policy
from controller.policies.pending import PendingJob

QUEUE_MIXES = ("queue_gpus.json", "queue_recurring.json")


def job(name: str, gpus: int = 1, arrival: float = 0.0, samples: int = 640) -> dict:
    return {"name": name, "gpus": gpus, "batch_size": 32, "compute_ms_per_batch": 40.0, "image_px": 96,
            "samples": samples, "arrival_s": arrival, "num_workers": 2}


def test_a_mix_gives_the_nodes_gpus_and_keeps_them_when_scaled() -> None:
    mix = mix_from_dict({"gpus": 4, "jobs": [job("a", 2), job("b", 4, 1.0)]})
    assert mix.gpus == 4 and mix.scaled(0.5).gpus == 4
    assert mix_from_dict(mix.to_dict()) == mix
    assert mix_from_dict({"jobs": [job("a")]}).gpus is None  # as before: every job starts at arrival


@pytest.mark.parametrize("document, problem", [
    ({"gpus": 2, "jobs": [job("big", 4)]}, "need more than the node's 2 GPUs"),
    ({"gpus": 0, "jobs": [job("a")]}, "gpus (the node's) must be an integer"),
    ({"gpus": 2.5, "jobs": [job("a")]}, "gpus (the node's) must be an integer"),
])
def test_a_queue_that_could_never_serve_its_jobs_is_refused(document: dict, problem: str) -> None:
    with pytest.raises(MixError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        mix_from_dict(document)


def test_waiting_jobs_start_first_come_first_served_the_first_blocking_those_behind() -> None:
    gpus = {"a": 2, "b": 4, "c": 1}
    assert starting_now(["a", "b", "c"], 3, gpus.get) == ["a"]  # b does not fit: c waits behind it
    assert starting_now(["b", "c"], 5, gpus.get) == ["b", "c"]
    assert starting_now(["b", "c"], None, gpus.get) == ["b", "c"]  # GPUs not modelled


def test_the_runner_counts_free_gpus_and_tells_the_controller_what_waits(tmp_path: Path) -> None:
    mix = mix_from_dict({"gpus": 4, "jobs": [job("a", 2), job("b", 1), job("c", 2, samples=960)]})
    specs = {spec.name: spec for spec in mix.jobs}
    running = [JobOutcome(specs["a"], 0.0), JobOutcome(specs["b"], 0.0, ended_s=3.0)]
    assert free_gpus(mix, running) == 2
    assert free_gpus(dataclasses.replace(mix, gpus=None), running) is None
    path = tmp_path / "pending.json"
    write_pending(path, [specs["c"]])
    assert FileQueue(path).read() == (PendingJob("c", 2, 960.0),)  # the controller's own reader


def _queued_run() -> RunOutcome:
    a = JobSpec(**{**job("a", 2), "arrival_s": 0.0})
    b = JobSpec(**{**job("b", 2), "arrival_s": 1.0})
    timeline = {"busy_s": 4.0, "loop_s": 5.0, "samples": 640}
    return RunOutcome(policy="jct", repeat=0, started_at=0.0, controller_cpu_s=0.1, wall_s=12.0, jobs=[
        JobOutcome(a, launched_s=0.0, ended_s=6.0, exit_code=0, timeline=timeline),
        JobOutcome(b, launched_s=6.5, ended_s=12.0, exit_code=0, timeline=timeline)])


def test_a_queued_jobs_wait_counts_in_its_completion_time() -> None:
    score = score_run(_queued_run())
    assert score["jobs"]["b"]["queued_s"] == pytest.approx(5.5)
    assert (score["jobs"]["b"]["start_s"], score["jobs"]["b"]["end_s"]) == (6.5, 12.0)
    assert score["jobs"]["b"]["jct_s"] == pytest.approx(11.0)
    assert score["mean_jct_s"] == pytest.approx((6.0 + 11.0) / 2)
    assert score["makespan_s"] == 12.0


def test_the_simulator_queues_jobs_for_the_gpus_and_shows_the_policy_what_waits() -> None:
    seen: list[tuple[str, ...]] = []

    class Watching:
        """The real adaptive policy, noting what waits at each step."""

        name = "watching"
        inner = make_policy("adaptive")

        def allocate(self, node, jobs):  # type: ignore[no-untyped-def]
            seen.append(tuple(p.name for p in node.pending or ()))
            return self.inner.allocate(node, jobs)

    shape = dict(max_throughput=400.0, cpu_s_per_sample=0.002, batch_size=32)
    jobs = [SimJob(name="first", gpus=2, samples=4000.0, **shape),  # type: ignore[arg-type]
            SimJob(name="second", gpus=2, samples=4000.0, arrival_s=1.0, **shape)]  # type: ignore[arg-type]
    queued = simulate(SimNode(cores=2, gpus=2), jobs, Watching(), seed=0).jobs
    free = simulate(SimNode(cores=2), jobs, make_policy("adaptive"), seed=0).jobs
    assert queued["second"]["queued_s"] == pytest.approx(queued["first"]["jct_s"] - 1.0, abs=1.0)
    assert queued["second"]["jct_s"] > queued["second"]["queued_s"] + 9.0  # 10 s at full speed, after its wait
    assert ("second",) in seen and seen[-1] == ()
    assert free["second"]["queued_s"] == 0.0


@pytest.mark.parametrize("name", QUEUE_MIXES)
def test_the_shipped_queueing_mixes_queue(name: str) -> None:
    mix = load_mix(MIXES_DIR / name)
    assert mix.gpus is not None and sum(spec.gpus for spec in mix.jobs) > mix.gpus
    jobs, _ = jobs_from_measured_mix({"mix": mix.to_dict()})
    assert len(jobs) == len(mix.jobs)
    if name == "queue_recurring.json":  # families of the same shape and length come back
        shapes = {(s.gpus, s.samples, s.image_px) for s in mix.jobs if s.name.startswith("eval-")}
        assert len([s for s in mix.jobs if s.name.startswith("eval-")]) >= 3 and len(shapes) == 1


def test_jct_cuts_mean_completion_time_where_jobs_queue_and_is_adaptive_where_none_do() -> None:
    """SIMULATED on the measured 2-core node: on the queueing mix jct ends running jobs in order
    of remaining time and the waiting ones start sooner; without a queue it is adaptive."""
    queued = mix_figures(load_mix(MIXES_DIR / "queue_gpus.json"), ["adaptive", "jct"], seeds=1)
    assert queued["vs_adaptive"]["jct"]["mean_jct_s"] < 0.95
    lengths = mix_figures(load_mix(MIXES_DIR / "jct_lengths.json").scaled(0.25), ["adaptive", "jct"], seeds=1)
    assert lengths["policies"]["jct"] == lengths["policies"]["adaptive"]


def test_jct_is_judged_on_completion_time_where_jobs_queue_and_on_gpu_busy_everywhere() -> None:
    from bench.node import goals

    def document(mix: dict, jct: tuple[float, float, float]) -> dict:
        entry = lambda busy, makespan, mean_jct: {"gpu_busy": busy, "makespan_s": makespan, "mean_jct_s": mean_jct,
                                                 "settle_s": 1.0}
        return {"mix": mix, "ratios": {}, "policies": {"adaptive": entry(0.5, 100.0, 50.0), "jct": entry(*jct)}}

    queued = goals(document({"gpus": 4, "jobs": [job("a")]}, (0.49, 102.0, 40.0)))
    assert {name: goal["met"] for name, goal in queued.items() if name.startswith("jct")} == {
        "jct_mean_jct_vs_adaptive": True, "jct_vs_adaptive_gpu_busy": True, "jct_vs_adaptive_makespan": True}
    free = goals(document({"jobs": [job("a")]}, (0.48, 100.0, 40.0)))
    assert "jct_mean_jct_vs_adaptive" not in free and not free["jct_vs_adaptive_gpu_busy"]["met"]
