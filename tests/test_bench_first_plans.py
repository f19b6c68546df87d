"""``python -m bench.first_plans``: the first plan's loading cost against the whole run's,
read from a run directory as the benchmark leaves it (a controller log, a job history
written by the controller's own JobHistory)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.first_plans import first_plans, main
from controller.history import FinishedJob, JobHistory


def _run_dir(root: Path) -> Path:
    run = root / "random-1" / "adaptive-0"
    history = JobHistory(run / "state" / "history.sqlite")
    for name, curve in (("early", ((0.5, 250.0),)), ("late", ((0.5, 250.0),)), ("r1-0-io", ((0.2, 400.0),))):
        history.record(FinishedJob(job_id=f"j-{name}", name=name, gpus=1, samples=1000, duration_s=20.0,
                                   finished_at=1.0, loading_curve=curve, exit_code=0))
    (run / "controller.log").write_text("\n".join([
        "2026-11-26 10:00:00,000 INFO controller.daemon: job jaaa (early) registered by pid 1 (uid 0), 1 GPU(s)",
        "2026-11-26 10:00:00,500 INFO controller.daemon: job jbbb (late) registered by pid 2 (uid 0), 1 GPU(s)",
        "2026-11-26 10:00:00,600 INFO controller.daemon: job jccc (r1-0-io) registered by pid 3 (uid 0), 1 GPU(s)",
        "2026-11-26 10:00:02,000 INFO controller.training_processes: job jaaa: training process 11 moved out of ...",
        "2026-11-26 10:00:03,000 INFO controller.training_processes: job jccc: training process 13 moved out of ...",
        # early's first plan: its window (from 10:00:00, its registration) held 2 s before the move, at 4x
        "2026-11-26 10:00:04,000 DEBUG controller.policies.adaptive: adaptive: models behind the new allocation: "
        "early w=1 M=100/s needs 0.92 cores, weight 1092 workers 1; late: not measured yet; "
        "r1-0-io w=1 M=100/s needs 0.20 cores, weight 1020 workers 1",
        "2026-11-26 10:00:06,500 INFO controller.training_processes: job jbbb: training process 12 moved out of ...",
        "2026-11-26 10:00:09,000 INFO controller.training_processes: job jaaa: training process 11 moved out of ...",
        # late's first plan: its window (from 10:00:07) starts after its move, at the whole run's cost
        "2026-11-26 10:00:12,000 DEBUG controller.policies.adaptive: adaptive: models behind the new allocation: "
        "early w=1 M=100/s needs 0.23 cores, weight 1023 workers 1; late w=1 M=200/s needs 0.46 cores, "
        "weight 1046 workers 1",
    ]) + "\n")
    return run


def test_first_plans_are_read_against_the_whole_run_and_readers_are_left_out(tmp_path: Path) -> None:
    plans = {plan.job: plan for plan in first_plans(_run_dir(tmp_path))}
    assert set(plans) == {"early", "late"}
    assert plans["early"].before_move_s == pytest.approx(2.0) and plans["early"].ratio == pytest.approx(4.0)
    assert plans["late"].before_move_s == 0.0 and plans["late"].ratio == pytest.approx(1.0)


def test_the_command_prints_the_buckets_and_writes_the_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _run_dir(tmp_path)
    out = tmp_path / "first_plans.json"
    assert main(["--runs", str(tmp_path / "random-*" / "adaptive-*"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[0, 0.01) s" in printed and "[2, inf) s" in printed
    document = json.loads(out.read_text())
    assert {row["before_move"]: row["plans"] for row in document["summary"]} == {
        "[0, 0.01) s": 1, "[2, inf) s": 1, "all": 2}
    assert main(["--runs", str(tmp_path / "nothing-*")]) == 1
