"""A program that imports adloader itself (``from adloader import DataLoader``, tests/framework_job.py)
keeps working without the substitution: under ``adloader run --no-substitute``, Lightning DDP and
Accelerate (through ``adloader.dataloader.accelerate.prepare_data_loader``) still iterate
``adloader.DataLoader``, it reports to the controller and follows the controller's worker target.
Programs that never import adloader are tests/test_unchanged_programs.py's. Skipped, with the
reason, when the framework is not installed (``./install.sh --test`` installs both)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench.controller_process import REPO, ControllerProcess, wait_until

SCRIPT = REPO / "tests" / "framework_job.py"
OURS = "adloader.dataloader.loader.DataLoader"


def needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"{module} is not installed (./install.sh --test installs it)",
    )


def train(controller: ControllerProcess, tmp_path: Path, framework: str, ranks: int) -> list[dict]:
    job = controller.run(sys.executable, str(SCRIPT), "--framework", framework, "--out", str(tmp_path),
                         "--stop-file", str(tmp_path / "stop"), name=f"{framework}-job",
                         options=("--no-substitute",))
    job_id = controller.registered(job).job_id
    snap = wait_until(
        lambda: (s := controller.job(job_id)) and s.ranks_reporting == ranks and s.samples_total > 0
        and s.workers_target and s,
        120.0, f"{ranks} rank(s) of the {framework} job to report; log:\n{controller.log()}",
    )
    target_per_rank = snap.workers_target // ranks
    wait_until(lambda: (s := controller.job(job_id)) and s.samples_total > snap.samples_total, 60.0,
               "more samples after the target was set")
    (tmp_path / "stop").touch()
    assert job.wait(120) == 0, job.output()
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
    for record in records:
        assert record["loader_class"] == OURS, f"{framework} trained over {record['loader_class']}, not ours"
        assert record["samples"] > 0
        assert target_per_rank in record["workers_seen"], (
            f"the controller's target ({target_per_rank} per rank) never reached the loader: {record}"
        )
    return records


@needs("lightning")
@pytest.mark.slow
def test_a_lightning_ddp_trainer_keeps_our_loader_reporting_and_resizing(controller: ControllerProcess,
                                                                         tmp_path: Path) -> None:
    records = train(controller, tmp_path, "lightning", ranks=2)
    assert records[0]["pid"] != records[1]["pid"]


@needs("accelerate")
@pytest.mark.slow
def test_accelerate_prepare_keeps_our_loader_reporting_and_resizing(controller: ControllerProcess,
                                                                    tmp_path: Path) -> None:
    [record] = train(controller, tmp_path, "accelerate", ranks=1)
    assert record["loader_class"] == OURS  # what prepare_data_loader handed back is still ours
