"""``adloader status``: the table's content, and the command against a real controller
(table, --json, --watch, no root needed) and against none (one line, exit code 2)."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from adloader import __version__
from adloader.client import ControllerClient
from adloader.protocol import JobSnapshot, NodeSnapshot, decode_object
from adloader.status import CLEAR_SCREEN, COLUMNS, EXIT_NO_CONTROLLER, effective_cores, fetch, render_table
from bench.controller_process import ControllerProcess, base_environment, default_signal_dispositions, wait_until
from fixtures.processes import run_forked_as_nobody

REPO = Path(__file__).resolve().parent.parent


def _node(*jobs: JobSnapshot) -> NodeSnapshot:
    return NodeSnapshot(
        version=__version__, policy="adaptive", backend="cgroup-v1", started_at=1000.0, period_s=1.0,
        cpus=(0, 1, 2, 3, 6), read_bps=200e6, read_device="254:0", jobs=jobs, connected_clients=3,
    )


def _job(job_id: str, name: str, **values: object) -> JobSnapshot:
    return JobSnapshot(**{"job_id": job_id, "name": name, "uid": 0, "gpus": 4, "state": "running",
                          "launcher_pid": 1, "pids": (1,), "cgroup": "/x", "registered_at": 0.0, **values})


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
                    data_wait_ratio=0.2, worker_memory_bytes=212.4 * 2**20, worker_memory_exact=True)
    fresh = _job("j-2", "bert", max_sps_predicted=88.25)
    roomy = _job("j-3", "vit", worker_memory_bytes=1.5 * 2**30, worker_memory_exact=False)
    table = render_table(_node(measured, fresh, roomy), now=1000.0 + 3 * 3600 + 125)
    head = table.splitlines()[0]
    for part in ("policy adaptive", "backend cgroup-v1", "5 cores (0-3,6)", "read 200 MB/s on 254:0", "3 jobs",
                 "3 clients", "up 3h02m"):
        assert part in head, part
    rows = _rows(table)
    assert rows["j-1"] == ["resnet50", "j-1", "running", "4", "410", "500", "18%", "2.5", "-", "5/6", "212M",
                           "50 MB/s", "20%"]
    # No quota, no weight: the kernel's default weight over the 2.5 cores the quota leaves, shared
    # with the other unweighted job; a worker's memory only where it was measured, "<=" a bound.
    assert rows["j-2"] == ["bert", "j-2", "running", "4", "-", "~88.2", "-", "~1.2", "-", "0/-", "-", "-", "-"]
    assert rows["j-3"][7:11] == ["~1.2", "-", "0/-", "<=1536M"]
    assert "~ predicted" in table and "~ cores: what the job's CPU weight gives it" in table
    assert "MEM/WORKER: a loader worker's own memory" in table and "<= an upper bound" in table
    assert "<= an upper bound" not in render_table(_node(measured, fresh), now=1000.0)


def test_a_weighted_job_shows_its_weight_and_the_cores_it_gives_on_the_contended_cpus() -> None:
    """adaptive enforces with weights: status shows each weight and what it is worth in cores."""
    heavy = _job("j-1", "resnet50", cpu_weight=300, cpus=(0, 1, 2, 3))
    light = _job("j-2", "bert", cpu_weight=100, cpus=(0, 1, 2, 3))
    capped = _job("j-3", "vit", cores=1.0, cpus=(6,))
    alone = _job("j-4", "gpt", cpu_weight=50, cpus=(6,))
    gone = _job("j-5", "old", cpu_weight=10_000, cpus=(0, 1, 2, 3), state="gone")
    node = _node(heavy, light, capped, alone, gone)
    assert effective_cores(node) == {"j-1": 3.0, "j-2": 1.0, "j-4": 0.0}  # the quota takes CPU 6 whole
    rows = _rows(render_table(node, now=1000.0))
    assert [rows[j][7:9] for j in ("j-1", "j-2", "j-3", "j-4")] == [
        ["~3.0", "300"], ["~1.0", "100"], ["1.0", "-"], ["~0.0", "50"]]


def test_a_nested_jobs_line_names_its_scheduler_its_cpu_limit_and_its_groups() -> None:
    pod = "/kubepods/burstable/pod1/c1/adloader/j-1"
    limited = _job("j-1", "resnet50", scheduler="kubernetes", scheduler_cpu_limit=0.25,
                   cgroups={"cpu": pod, "cpuacct": pod})
    bare = _job("j-2", "bert", cgroups={"cpu": "/adloader/j-2"})
    lines = render_table(_node(limited, bare), now=1000.0).splitlines()
    assert f"@ resnet50 (j-1) scheduler kubernetes, CPU limit 0.25 cores: cpu,cpuacct={pod}" in lines
    assert "@ bert (j-2) scheduler none: cpu=/adloader/j-2" in lines


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


# ---------------------------------------------------------------- against a real controller

REPORTING_JOB = (sys.executable, str(REPO / "tests" / "reporting_job.py"), "--seconds", "60")


def _status(controller: ControllerProcess, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adloader", "status", "--socket", str(controller.socket), *options],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env=base_environment())


def _reporting(controller: ControllerProcess, name: str) -> JobSnapshot:
    job = controller.registered(controller.run(*REPORTING_JOB, name=name, options=("--gpus", "2")))
    return wait_until(lambda: (snap := controller.job(job.job_id)) and snap.achieved_sps and snap, 20,
                      f"{name}'s first reports")


def test_status_shows_a_reporting_jobs_row_and_json_matches_the_controller(controller: ControllerProcess) -> None:
    job = _reporting(controller, "status-table")
    table = _status(controller)
    assert table.returncode == 0, table.stderr
    row = _rows(table.stdout)[job.job_id]
    assert row[:4] == ["status-table", job.job_id, "running", "2"]
    assert float(row[4]) > 0 and row[7] == "1.0"  # achieved samples/s; even policy on CPU 0: one core
    assert "policy even" in table.stdout.splitlines()[0]

    as_json = _status(controller, "--json")
    assert as_json.returncode == 0, as_json.stderr
    node = decode_object(NodeSnapshot, json.loads(as_json.stdout), "status")
    (seen,) = node.jobs
    assert (seen.job_id, seen.name, seen.gpus, seen.cores, seen.cgroup) == (job.job_id, job.name, 2, 1.0, job.cgroup)
    assert seen.samples_total >= job.samples_total > 0
    assert node.cpus == (0,) and node.policy == "even"


def test_status_needs_no_root(controller: ControllerProcess) -> None:
    job = _reporting(controller, "status-nobody")

    def status_as_nobody() -> dict:
        with ControllerClient(controller.socket) as client:
            snapshot = fetch(client)
        return {"uid": os.getuid(), "jobs": [j.job_id for j in snapshot.jobs],
                "table": render_table(snapshot, snapshot.started_at)}

    seen = run_forked_as_nobody(status_as_nobody)
    assert seen["uid"] == 65534 and seen["jobs"] == [job.job_id] and "status-nobody" in seen["table"]


def test_watch_redraws_a_terminal_in_place_and_keeps_going_when_the_controller_goes(
    controller: ControllerProcess,
) -> None:
    job = _reporting(controller, "status-watch")
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "adloader", "status", "--watch", "0.2", "--socket",
                             str(controller.socket)], stdout=secondary, stderr=secondary, cwd=REPO,
                            env=base_environment(), start_new_session=True,
                            preexec_fn=default_signal_dispositions)  # SIGINT must end it, even under nohup
    os.close(secondary)
    screen = b""
    try:
        def read_until(predicate: Callable[[bytes], bool]) -> bytes:
            nonlocal screen
            def more() -> bool:
                nonlocal screen
                if select.select([primary], [], [], 0.2)[0]:
                    screen += os.read(primary, 65536)
                return predicate(screen)
            wait_until(more, 20, f"status --watch output; so far: {screen[-500:]!r}", interval=0)
            return screen

        read_until(lambda s: s.count(CLEAR_SCREEN.encode()) >= 3 and job.job_id.encode() in s)
        controller.stop()
        read_until(lambda s: b"retrying" in s)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(primary)
    last_frame = screen.split(CLEAR_SCREEN.encode())[-1].decode()
    assert "retrying" in last_frame and "status-watch" not in last_frame


def test_watch_into_a_pipe_prints_one_json_object_per_line_and_refresh(controller: ControllerProcess) -> None:
    _reporting(controller, "status-pipe")
    proc = subprocess.Popen([sys.executable, "-m", "adloader", "status", "--watch", "0.1", "--json", "--socket",
                             str(controller.socket)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env=base_environment(), start_new_session=True,
                            preexec_fn=default_signal_dispositions)
    try:
        assert proc.stdout is not None
        frames = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        proc.stdout.close()
    samples = [frame["jobs"][0]["samples_total"] for frame in frames]
    assert all(CLEAR_SCREEN not in json.dumps(f) for f in frames) and samples == sorted(samples)
