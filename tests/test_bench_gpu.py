"""``python -m bench.gpu``: the prepared GPU check, kept working on CPU by its dry run.

The dry run is the whole check (every part, the node benchmark with a real controller and
real jobs) on the emulated device, so the script cannot rot between lent GPU machines. The
CUDA paths themselves run only where there is a GPU (``python -m bench.gpu --out DIR``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from bench.controller_process import cgroup_v1_usable
from bench.gpu_check.device import EmulatedDevice
from bench.gpu_check.model_fit import interleaved
from bench.gpu_check.plan import DRY_RUN
from bench.gpu_check.run import run_all
from bench.mix import JobSpec
from bench.runner import job_command
from throughput_model.zoo import ZOO

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("data_wait", "overhead", "resize", "throughput_model", "node")


def _bench_gpu(*args: str, python: list[str] | None = None, timeout: float = 170) -> subprocess.CompletedProcess:
    return subprocess.run([*(python or [sys.executable, "-m", "bench.gpu"]), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_the_dry_run_checks_every_part_and_writes_a_sane_summary(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _bench_gpu("--out", str(tmp_path), "--dry-run")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert elapsed < 120, f"the dry run must stay under 2 minutes, took {elapsed:.0f} s"
    first = done.stdout.splitlines()[0]
    assert first.startswith("bench.gpu: python ") and "torch " in first and "CUDA" in first, first
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and {name: part["status"] for name, part in summary["parts"].items()} == dict.fromkeys(
        PARTS, "ok")
    for name in PARTS:
        assert (tmp_path / f"{name}.json").is_file(), f"the raw data of {name} is written beside the summary"
    assert summary["emulated"] is True and "emulated" in summary["device"] and "no GPU" in summary["note"]
    assert isinstance(summary["cpus"], int) and summary["cpus"] >= 1
    assert "CUDA" in summary["torch"]
    datetime.fromisoformat(summary["started_utc"])
    # the reporter reads the device's timeline: close to the truth where the wall clock is far off
    assert 0.0 <= summary["data_wait_error"] < 0.6
    assert summary["data_wait"]["cpu_timer_error"] > 2.0 > summary["data_wait_error"]
    assert "CPU clock stands in" in summary["data_wait"]["truth"]
    cases = json.loads((tmp_path / "data_wait.json").read_text())["cases"]
    assert [case["name"] for case in cases] == ["starved", "keeps_up", "kernels_outlast_python"]
    assert all(case["reporter_on_device"] for case in cases)
    assert 0.5 < summary["reporter_overhead"] < 2.0
    assert 0.5 < summary["overhead"]["reporter_overhead_fast_switch"] < 2.0  # again at a 0.5 ms GIL switch interval
    assert 0.0 < summary["overhead"]["step_timer_us"] < 10_000
    resize = summary["resize"]
    assert resize["exactly_once"] is True and resize["samples"] == DRY_RUN.resize_samples
    assert resize["resize_latency_max_s"] is None or 0.0 < resize["resize_latency_max_s"] < 10.0
    model = summary["throughput_model"]
    assert model["points"] == len(DRY_RUN.model_points) and len(model["families"]) == 3
    assert model["fitted_lofo_mean_ape"] >= 0.0 and model["prior_mean_ape"] >= 0.0
    node = summary["node"]
    assert node["mix"] == "gpu-check-tiny" and node["jobs"] == 2 and node["stages_done"] == 2
    for ratio in ("adaptive_vs_static_gpu_busy", "adaptive_vs_even_gpu_busy", "adaptive_vs_oracle_gpu_busy",
                  "with_loaders_vs_static_gpu_busy"):
        assert 0.2 < node[ratio] < 5.0, (ratio, node[ratio])
    assert set(node["gpu_busy"]) >= {"static", "even", "adaptive", "adaptive@with-loaders", "oracle"}
    # each run's controller log is kept for whoever reads the results, and each job's own CPU apart
    logs = {log.name for log in (tmp_path / "node-logs").iterdir()}
    assert {"static-0.controller.log", "adaptive-0.controller.log"} <= logs, logs
    assert "policy" in (tmp_path / "node-logs" / "adaptive-0.controller.log").read_text()
    jobs = json.loads((tmp_path / "node.json").read_text())["documents"][0]["policies"]["adaptive"]["repeats"][0]["jobs"]
    for job in jobs.values():
        assert 0.0 < job["training_cpu_s"] <= job["loader_cpu_s"] and job["torch_threads"] >= 1, job
    assert all(0.0 < busy <= 1.0 for busy in node["gpu_busy"].values())
    assert node["settle_s"] is not None and node["settle_s"] >= 0.0


def test_without_a_gpu_it_says_so_and_names_the_dry_run(tmp_path: Path) -> None:
    done = _bench_gpu("--out", str(tmp_path))
    assert done.returncode == 3
    assert done.stdout.startswith("bench.gpu: python "), "what it found comes first"
    assert "no CUDA device" in done.stderr and "--dry-run" in done.stderr
    assert not (tmp_path / "summary.json").exists()


def test_without_torch_it_fails_fast_in_one_line(tmp_path: Path) -> None:
    """A Python whose torch cannot be imported (as a lent machine's might be)."""
    no_torch = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['bench.gpu'] + sys.argv[1:]; "
                "runpy.run_module('bench.gpu', run_name='__main__')")
    done = _bench_gpu("--out", str(tmp_path), python=[sys.executable, "-c", no_torch])
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "needs torch" in done.stderr, done.stderr


def test_a_part_that_fails_or_overruns_is_recorded_and_the_others_still_run(tmp_path: Path) -> None:
    device = EmulatedDevice()

    def fails() -> dict:
        raise RuntimeError("a CUDA error in one part")

    def overruns() -> dict:
        (tmp_path / "second.json").write_text(json.dumps({"kept": 1}))  # its result so far, as the node part keeps
        time.sleep(30)
        return {}

    calls = {"first": fails, "second": overruns, "third": lambda: {"value": 1.5}}
    try:
        summary = run_all(device, DRY_RUN, tmp_path, budgets={"first": 5, "second": 0.5, "third": 5},
                          progress=lambda line: None, calls=calls)
    finally:
        device.close()
    assert summary["parts"]["first"]["status"] == "error" and "a CUDA error" in summary["parts"]["first"]["error"]
    assert summary["parts"]["second"]["status"] == "timeout" and summary["parts"]["second"]["seconds"] < 5
    assert summary["second"] == {"partial": True, "kept": 1}, "what a stopped part kept is summarised"
    assert summary["parts"]["third"]["status"] == "ok" and summary["third"] == {"value": 1.5}
    assert not summary["ok"]
    assert "RuntimeError" in (tmp_path / "first.error.txt").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["parts"] == summary["parts"]


def test_a_part_with_too_little_time_left_is_skipped(tmp_path: Path) -> None:
    device = EmulatedDevice()
    calls = {"long": lambda: time.sleep(3) or {"done": True}, "late": lambda: {"ran": True}}
    try:
        summary = run_all(device, DRY_RUN, tmp_path, budgets={"long": 20, "late": 20}, progress=lambda line: None,
                          calls=calls, total_s=12)
    finally:
        device.close()
    assert summary["parts"]["long"]["status"] == "ok"
    assert summary["parts"]["late"]["status"] == "skipped" and "late" not in summary


def test_the_zoo_is_profiled_one_family_after_another() -> None:
    points = [(model, model.batches[0]) for model in ZOO]
    order = interleaved(points)
    families = list(dict.fromkeys(model.family for model in ZOO))
    assert sorted(order, key=id) == sorted(points, key=id)
    assert [model.family for model, _ in order[:len(families)]] == families, "every family before any second point"


@pytest.mark.slow
def test_a_node_job_trains_a_real_model_when_told(tmp_path: Path) -> None:
    """``--compute cpu``: the path a GPU machine takes with ``cuda``, the zoo model trained on each batch."""
    from bench.datasets import make_jpeg_cache

    dataset = make_jpeg_cache(ROOT / "bench" / "cache", 64, 32)
    timeline = tmp_path / "t.json"
    spec = JobSpec(name="real", gpus=1, batch_size=8, compute_ms_per_batch=5.0, image_px=64, samples=16, arrival_s=0.0,
                   num_workers=1)
    command = job_command(spec, dataset, timeline, compute="cpu")
    assert command[-2:] == ["--compute", "cpu"]
    assert "--compute" not in job_command(spec, dataset, timeline), "GPU-emulated jobs run as before"
    job = command[command.index("--") + 1:]
    done = subprocess.run(job, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(timeline.read_text())
    assert result["compute"] == "cpu" and result["samples"] == 16 and result["gpu_late_s"] == 0.0
    assert result["cpu_s"] > 0.0


@pytest.mark.skipif(not cgroup_v1_usable(), reason="the node part runs a real controller: it needs root and cgroup v1")
def test_a_stage_that_would_not_fit_in_what_is_left_is_not_started_and_the_result_says_why() -> None:
    """After the first stage, a later one (the oracle's, which measures every job's true curves
    first) starts only with ORACLE_AFTER times the first stage's time left; else the part ends
    with what it measured and ``not_run`` names the stage and the seconds."""
    from bench.gpu_check import node_check
    from bench.node import CACHE_DIR

    kept: list[dict] = []
    result = node_check.run(DRY_RUN.node_mix, 1.0, DRY_RUN.node_cpus, "sleep", CACHE_DIR, keep=kept.append,
                            progress=lambda line: None, time_left=lambda: 1.0, stages=(("static",), ("oracle",)))
    assert result["stages_done"] == 1 and set(result["gpu_busy"]) == {"static"}
    assert result["not_run"].startswith("oracle: 1 s of the part's budget were left, under 1.5x the ")
    assert kept[-1] is result  # kept as the part's result so far, as after every stage


def test_auto_compute_is_emulated_without_a_gpu() -> None:
    from bench.gpu_step import resolve

    assert resolve("auto") == "sleep"
    assert resolve("cuda") == "cuda"


@pytest.mark.skipif(not cgroup_v1_usable(),
                    reason="cgroup v1's cpu hierarchy is not mounted writable here (or not root): the script would reconfigure this "
                           "machine's cgroups, which a test must never do")
def test_asked_to_mount_cgroup_v1_where_it_is_mounted_it_says_so_and_goes_on(tmp_path: Path) -> None:
    done = _bench_gpu("--out", str(tmp_path), "--dry-run", "--parts", "resize", "--mount-cgroup-v1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cgroup_v1_beside_v2: cgroup v1 cpu is already mounted" in done.stdout
    assert json.loads((tmp_path / "summary.json").read_text())["parts"]["resize"]["status"] == "ok"

