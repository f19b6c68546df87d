"""``python -m bench.slurm_queue``: a mix's jobs submitted to Slurm with ``sbatch --gres=gpu:N``,
under a fresh controller per policy, mean JCT from Slurm's own records (GPU-emulated).

Each job of the mix is the node benchmark's (``adloader run ... -- python -m bench.job``,
bench/runner.py's ``job_command``), submitted at its ``arrival_s`` with the GPUs it asks for;
Slurm queues it until they are free. The controller watches Slurm's queue (``--pending
slurm:PARTITION``). Completion times, submit to end, come from ``sacct`` or, without slurmdbd,
from the job completion file (bench/slurm_jct.py). Policies run one after the other, interleaved
over repeats. ``--test-cluster`` starts the tests' one-node Slurm with 8 GPUs held as generic
resources (tests/fixtures/slurm.py) instead of using the machine's own.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.controller_process import REPO, Cleanup, base_environment, wait_until
from bench.mix import MIXES_DIR, JobSpec, Mix, load_mix
from bench.node import prepare_datasets
from bench.runner import job_command
from bench.slurm_jct import JobTimes, completion_times, mean_jct_s

DEFAULT_MIX = MIXES_DIR / "queue_gpus.json"
PERIOD_S = 1.0


def submit_script(spec: JobSpec, dataset: Path, out: Path) -> Path:
    """The batch script of one mix job: the benchmark's job under ``adloader run``."""
    command = " ".join(job_command(spec, dataset, out / f"{spec.name}.timeline.json"))
    script = out / f"{spec.name}.sh"
    script.write_text(f"#!/bin/bash\nexec {command}\n")
    return script


def run_workload(mix: Mix, policy: str, environ: dict[str, str], partition: str, datasets: dict[str, Path],
                 workdir: Path, cpus: str = "0-1", jobcomp: Path | None = None, timeout_s: float = 900.0,
                 cpus_per_job: int = 2) -> tuple[list[JobTimes], str]:
    """Submit ``mix`` under a controller running ``policy`` (sharing ``cpus``), each job given
    ``cpus_per_job`` CPUs by Slurm (the partition oversubscribes them: the controller moves the
    cores between jobs within what Slurm gave each); each job's times and their source."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)
    cleanup = Cleanup()
    ids: list[int] = []
    slurm = {key: environ[key] for key in ("SLURM_CONF", "PATH") if key in environ}
    try:
        controller = cleanup.new_controller(("--policy", policy, "--cpus", cpus, "--pending", f"slurm:{partition}"),
                                            PERIOD_S, base_environment(**slurm))
        controller.start()
        job_environ = {**environ, **base_environment(ADLOADER_SOCKET=str(controller.socket))}
        start = time.monotonic()
        for spec in sorted(mix.jobs, key=lambda j: j.arrival_s):
            time.sleep(max(0.0, spec.arrival_s - (time.monotonic() - start)))
            script = submit_script(spec, datasets[spec.name], workdir)
            ids.append(_sbatch(script, spec, partition, workdir, job_environ, cpus_per_job))
        wait_until(lambda: not _squeue(ids, environ), timeout_s, f"the {policy} workload to finish", interval=1.0)
    finally:
        cleanup.run()
    runner = _runner(environ)
    wait_until(lambda: len(completion_times(ids, jobcomp, runner)[0]) == len(ids), 30, "every job's completion record")
    return completion_times(ids, jobcomp, runner)


def _runner(environ: dict[str, str]):  # type: ignore[no-untyped-def]
    import subprocess

    return lambda argv: subprocess.run(list(argv), env=environ, capture_output=True, text=True, timeout=30)


def _sbatch(script: Path, spec: JobSpec, partition: str, workdir: Path, environ: dict[str, str],
            cpus_per_job: int) -> int:
    result = _runner(environ)(["sbatch", "--parsable", f"--gres=gpu:{spec.gpus}", f"--partition={partition}",
                              f"--cpus-per-task={cpus_per_job}",
                              f"--job-name={spec.name}", "-o", str(workdir / f"{spec.name}.out"),
                              f"--chdir={REPO}", str(script)])
    if result.returncode != 0:
        raise RuntimeError(f"sbatch {spec.name} failed: {result.stderr.strip()}")
    return int(result.stdout.strip().split(";")[0])


def _squeue(ids: Sequence[int], environ: dict[str, str]) -> str:
    result = _runner(environ)(["squeue", "--noheader", f"--jobs={','.join(map(str, ids))}"])
    return result.stdout.strip() if result.returncode == 0 else ""


def summary(runs: dict[str, list[list[JobTimes]]], source: str) -> dict[str, Any]:
    """Per policy: mean JCT of each repeat, their median, the mean wait; jct against adaptive."""
    policies = {name: {"mean_jct_s": [mean_jct_s(times) for times in repeats],
                       "mean_wait_s": [statistics.fmean(job.waited_s for job in times) for times in repeats],
                       "jobs": [[{"name": j.name, "submit": j.submit.isoformat(), "start": j.start.isoformat(),
                                  "end": j.end.isoformat(), "state": j.state} for j in times] for times in repeats]}
                for name, repeats in runs.items()}
    for entry in policies.values():
        entry["median_mean_jct_s"] = statistics.median(entry["mean_jct_s"])
    document: dict[str, Any] = {"benchmark": "Slurm queue (GPU-emulated), times submit to end", "source": source,
                                "policies": policies}
    if "jct" in policies and "adaptive" in policies:
        document["jct_mean_jct_vs_adaptive"] = (policies["jct"]["median_mean_jct_s"]
                                                / policies["adaptive"]["median_mean_jct_s"])
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slurm_queue", description=__doc__.split("\n")[0])
    parser.add_argument("--mix", type=Path, default=DEFAULT_MIX, help=f"default {DEFAULT_MIX.name}")
    parser.add_argument("--policies", default="adaptive,jct")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every job's samples and arrival")
    parser.add_argument("--partition", default="test", help="the Slurm partition of this node (default test)")
    parser.add_argument("--cpus", default="0-1", help="CPUs the controller shares (default 0-1)")
    parser.add_argument("--cpus-per-job", type=int, default=2, help="CPUs Slurm gives each job (default 2)")
    parser.add_argument("--jobcomp", type=Path, default=None, help="the JobCompLoc file, where sacct cannot answer")
    parser.add_argument("--test-cluster", action="store_true",
                        help="start the tests' one-node Slurm with 8 GPUs (root, cgroup v1, Slurm installed)")
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / "cache")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/adloader-slurm-bench"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    mix = load_mix(args.mix)
    if args.scale != 1.0:
        mix = mix.scaled(args.scale)
    datasets = prepare_datasets(mix, args.cache)
    cluster = None
    environ, jobcomp = dict(os.environ), args.jobcomp
    if args.test_cluster:
        sys.path.insert(0, str(REPO / "tests"))
        from fixtures.slurm import SlurmCluster

        started = SlurmCluster.start(gpus=8)
        if isinstance(started, str):
            parser.error(f"cannot start the test cluster: {started}")
        cluster, environ, jobcomp = started, started.environ, started.directory / "completed_jobs"
    runs: dict[str, list[list[JobTimes]]] = {}
    source = ""
    try:
        for repeat in range(args.repeats):
            for policy in args.policies.split(","):
                times, source = run_workload(mix, policy, environ, args.partition, datasets,
                                             args.workdir / f"{policy}-{repeat}", cpus=args.cpus, jobcomp=jobcomp,
                                             cpus_per_job=args.cpus_per_job)
                runs.setdefault(policy, []).append(times)
                print(f"{policy} repeat {repeat}: mean JCT {mean_jct_s(times):.1f} s over {len(times)} jobs "
                      f"(mean wait {statistics.fmean(j.waited_s for j in times):.1f} s; from {source})", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    document = summary(runs, source)
    if "jct_mean_jct_vs_adaptive" in document:
        print(f"jct mean JCT {document['jct_mean_jct_vs_adaptive']:.3f}x adaptive's (GPU-emulated, Slurm's times)")
    if args.json:
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
