"""A two-rank torchrun job (gloo on CPU, DistributedSampler) under ``adloader run``: each rank's
loader reports on its own, the controller sums them per job, and every sample is loaded once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.controller_process import REPO, ControllerProcess, wait_until

SCRIPT = REPO / "tests" / "loader_job.py"


@pytest.mark.slow
def test_two_ranks_report_separately_and_the_controller_sums_them(controller: ControllerProcess,
                                                                  tmp_path: Path) -> None:
    job = controller.run(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
        "--distributed", "--out", str(tmp_path), "--workers", "2", "--seconds", "120",
        "--stop-file", str(tmp_path / "stop"), name="torchrun-job",
    )
    job_id = controller.registered(job).job_id
    snap = wait_until(lambda: (s := controller.job(job_id)) and s.ranks_reporting == 2 and s.samples_total > 0 and s,
                      60.0, f"both ranks to report; log:\n{controller.log()}")
    (tmp_path / "stop").touch()
    assert job.wait(90) == 0, job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["pid"] != ranks[1]["pid"]
    first_epoch = [r["epochs"][0] for r in ranks]
    assert sorted(first_epoch[0] + first_epoch[1]) == list(range(400)), "DistributedSampler shards, each loaded once"
    assert set(ranks[0]["worker_pids"]).isdisjoint(ranks[1]["worker_pids"])
    assert snap.workers_target is not None
    assert all(r["num_workers"] * 2 == snap.workers_target for r in ranks), "the job's target is split per rank"
