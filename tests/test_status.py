"""``adloader status``: the table's content, and the command against a real controller
(table, --json, --watch, no root needed) and against none (one line, exit code 2)."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

from adloader import __version__
from adloader.status import COLUMNS, EXIT_NO_CONTROLLER, render_table
from controller.snapshot import JobSnapshot, NodeSnapshot

REPO = Path(__file__).resolve().parent.parent


def _node(*jobs: JobSnapshot) -> NodeSnapshot:
    return NodeSnapshot(
        version=__version__, policy="adaptive", backend="cgroup-v1", started_at=1000.0, period_s=1.0,
        cpus=(0, 1, 2, 3, 6), read_bps=200e6, read_device="254:0", jobs=jobs, connected_clients=3,
    )


def _job(job_id: str, name: str, **values: object) -> JobSnapshot:
    return JobSnapshot(job_id=job_id, name=name, uid=0, gpus=4, state="running", launcher_pid=1, pids=(1,),
                       cgroup="/x", registered_at=0.0, **values)


def _rows(table: str) -> dict[str, list[str]]:
    """Job rows of a rendered table by job id, split on runs of two or more spaces."""
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("JOB"))
    rows = {}
    for line in lines[header + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(COLUMNS):
            rows[cells[1]] = cells
    return rows


def test_table_shows_each_jobs_numbers_in_operator_units() -> None:
    measured = _job("j-1", "resnet50", achieved_sps=410.4, max_sps_measured=500.0, max_sps_predicted=520.0,
                    gpu_idle_ratio=0.179, cores=2.5, workers_target=6, workers_running=5, read_bps=50_000_000,
                    data_wait_ratio=0.2)
    fresh = _job("j-2", "bert", max_sps_predicted=88.25)
    table = render_table(_node(measured, fresh), now=1000.0 + 3 * 3600 + 125)
    head = table.splitlines()[0]
    for part in ("policy adaptive", "backend cgroup-v1", "5 cores (0-3,6)", "read 200 MB/s on 254:0", "2 jobs",
                 "3 clients", "up 3h02m"):
        assert part in head, part
    rows = _rows(table)
    assert rows["j-1"] == ["resnet50", "j-1", "running", "4", "410", "500", "18%", "2.5", "5/6", "50 MB/s", "20%"]
    assert rows["j-2"] == ["bert", "j-2", "running", "4", "-", "~88.2", "-", "-", "0/-", "-", "-"]
    assert "~ predicted" in table


def test_table_of_an_empty_node_says_how_to_start_a_job() -> None:
    table = render_table(NodeSnapshot(version="0", policy="even", backend="affinity", started_at=0.0, period_s=1.0,
                                      cpus=(0,), read_bps=None, read_device=None), now=59.0)
    assert "read unmanaged" in table and "up 0m59s" in table
    assert "adloader run" in table and not _rows(table)


def test_no_controller_is_one_clear_line_and_exit_code_2(tmp_path: Path) -> None:
    socket_path = tmp_path / "nobody-home.sock"
    for extra in ([], ["--json"], ["--watch", "0.1"]):
        proc = subprocess.run([sys.executable, "-m", "adloader", "status", "--socket", str(socket_path), *extra],
                              capture_output=True, text=True, timeout=30, cwd=REPO)
        assert proc.returncode == EXIT_NO_CONTROLLER, proc.stderr
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(socket_path) in lines[0] and "adloader controller" in lines[0], lines
