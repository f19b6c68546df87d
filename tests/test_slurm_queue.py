"""Jobs queueing for GPUs on a real one-node Slurm (tests/fixtures/slurm.py given 8 GPUs as
generic resources over character devices): ``sbatch --gres=gpu:N`` jobs wait in Slurm's own
queue (reason Resources) and start as GPUs free, each ``adloader run`` under a controller that
watches the queue (``--pending slurm:test``, policy jct); completion times, submit to end, come
from Slurm's accounting (bench/slurm_jct.py: sacct, or without slurmdbd its job completion
file). Skips, saying why, where Slurm cannot run (``./install.sh --test`` installs it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from bench.controller_process import REPO, Cleanup, base_environment, wait_until
from bench.slurm_jct import completion_times, mean_jct_s, parse_jobcomp, parse_sacct
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1
from fixtures.slurm import SlurmCluster

GPUS = (4, 4, 2, 4, 2, 2)
"""Six jobs on 8 GPUs: two start, the others wait."""
SCRIPT = """#!/bin/bash
exec {python} -m adloader run --name {name} --gpus {gpus} --samples 200 -- {python} {repo}/tests/loader_job.py \\
    --out {out} --workers 1 --work 2000 --compute-s 0.01 --samples 100 --seconds 2
"""


def test_sacct_and_jobcomp_lines_give_submit_start_and_end() -> None:
    sacct = parse_sacct("7|train|2026-11-28T05:00:00|2026-11-28T05:00:10|2026-11-28T05:01:00|COMPLETED\n"
                        "8|wait|2026-11-28T05:00:01|Unknown|Unknown|PENDING\n")
    assert [(job.job_id, job.waited_s, job.jct_s) for job in sacct] == [("7", 10.0, 60.0)]
    comp = parse_jobcomp("JobId=9 UserId=root(0) Name=q1 JobState=COMPLETED StartTime=2026-11-28T05:05:34 "
                         "EndTime=2026-11-28T05:05:37 SubmitTime=2026-11-28T05:05:32 ExitCode=0:0\n")
    assert [(job.name, job.state, job.jct_s) for job in comp] == [("q1", "COMPLETED", 5.0)]


@pytest.fixture()
def cluster() -> Iterator[SlurmCluster]:
    if not CGROUP_V1_USABLE:
        pytest.skip(NO_CGROUP_V1)
    started = SlurmCluster.start(gpus=8)
    if isinstance(started, str):
        pytest.skip(f"no Slurm cluster here: {started}")
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.slow
def test_jobs_queue_for_gpus_in_slurm_and_the_controller_sees_what_waits(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    cleanup = Cleanup()
    try:
        controller = cleanup.new_controller(("--policy", "jct", "--cpus", "0", "--pending", "slurm:test"), 0.5,
                                            base_environment(SLURM_CONF=cluster.environ["SLURM_CONF"]))
        controller.start()
        environ = base_environment(ADLOADER_SOCKET=str(controller.socket))
        ids = []
        for index, gpus in enumerate(GPUS):
            out = tmp_path / f"q{index}"
            out.mkdir()
            os.chmod(out, 0o755)
            script = out / "job.sh"
            script.write_text(SCRIPT.format(python=sys.executable, name=f"q{index}", gpus=gpus, out=out, repo=REPO))
            ids.append(cluster.sbatch(script, f"--gres=gpu:{gpus}", "-c", "1", f"--job-name=q{index}",
                                      "-o", str(out / "slurm.out"), f"--chdir={REPO}", environ=environ))
        reasons: set[str] = set()

        def queue_drained() -> bool:
            pending = cluster.command("squeue", "--noheader", "--states=PENDING", "--format=%r", check=False)
            reasons.update(pending.split())
            return not cluster.command("squeue", "--noheader", check=False).strip()

        wait_until(lambda: "Resources" in reasons or queue_drained(), 20, "a job waiting for GPUs", interval=0.3)
        wait_until(lambda: "job(s) wait for this node's GPUs: " in controller.log(), 20,
                   f"the controller to see the queue; its log:\n{controller.log()[-3000:]}", interval=0.3)
        wait_until(queue_drained, 90, f"the queue to drain; {cluster.logs()}", interval=0.5)
        wait_until(lambda: "0 job(s) wait for this node's GPUs" in controller.log(), 10,
                   "the controller to see the queue empty again")
    finally:
        cleanup.run()
    assert "Resources" in reasons  # held for GPUs by Slurm itself, not by us
    wait_until(lambda: len(completion_times(ids, cluster.directory / "completed_jobs", _in(cluster))[0]) == len(ids),
               10, "every job's completion record")
    times, source = completion_times(ids, cluster.directory / "completed_jobs", _in(cluster))
    assert {job.state for job in times} == {"COMPLETED"}, [(job.name, job.state) for job in times]
    assert all(job.submit <= job.start <= job.end for job in times)
    assert max(job.waited_s for job in times) >= 2.0  # a job waited for another's GPUs
    assert mean_jct_s(times) > statistics_floor(times)
    print(f"mean JCT {mean_jct_s(times):.1f} s over {len(times)} jobs, from {source}")


def statistics_floor(times: list) -> float:
    """The mean of the jobs' run times alone: with the waits counted, mean JCT is above it."""
    return sum((job.end - job.start).total_seconds() for job in times) / len(times)


def _in(cluster: SlurmCluster):  # type: ignore[no-untyped-def]
    """Commands run against the test's cluster (its SLURM_CONF)."""
    return lambda argv: subprocess.run(list(argv), env=cluster.environ, capture_output=True, text=True, timeout=30)


def test_the_slurm_benchmark_compares_policies_on_slurms_times() -> None:
    """bench/slurm_queue.py's summary: each policy's mean JCT per repeat, their median, and
    jct against adaptive (its runs under Slurm: ``python -m bench.slurm_queue --test-cluster``)."""
    from bench.slurm_queue import summary

    def times(jct: float) -> list:
        return parse_sacct(f"1|a|2026-11-28T05:00:00|2026-11-28T05:00:02|2026-11-28T05:00:{jct:02.0f}|COMPLETED\n"
                           f"2|b|2026-11-28T05:00:00|2026-11-28T05:00:04|2026-11-28T05:00:{jct + 2:02.0f}|COMPLETED")
    document = summary({"adaptive": [times(20), times(30)], "jct": [times(16), times(18)]}, "sacct")
    assert document["policies"]["adaptive"]["mean_jct_s"] == [21.0, 31.0]
    assert document["policies"]["jct"]["mean_wait_s"] == [3.0, 3.0]
    assert document["jct_mean_jct_vs_adaptive"] == pytest.approx(18.0 / 26.0)
