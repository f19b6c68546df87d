"""One benchmark run: a real controller under one policy, the mix's jobs launched through
``adloader run`` at their arrival times, and what came out of it.

Everything is real: the controller is ``python -m adloader controller`` with its own
socket, state directory and cgroup group (``adloader-bench-<uuid8>``); each job is
``python -m adloader run ... -- python -m bench.job ...``, which writes its timeline.
Both run through the shared harness, bench/controller_process.py.
While the run lasts, the controller's status is polled twice a second (the
allocations over time) and its CPU time is read from /proc through psutil. At the
end every process the run started is gone and its cgroup group removed.

The group is made before the controller starts, with a large ``cpu.shares``: on a
machine shared with other work the jobs then compete mostly with each other, as
on a dedicated training node, so other load disturbs the comparison less. Inside
the group each job has the default weight, so ``static`` is still the kernel's
fair share between jobs.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import psutil

from adloader.errors import AdloaderError
from bench.controller_process import (
    CGROUP_ROOT, Cleanup, ControllerProcess, JobProcess, base_environment, cgroup_of, move_into,
)
from bench.gpu_queue import starting_now
from bench.mix import JobSpec, Mix
from bench.model_jobs import write_features
from controller.backends.cgroupfs import write_interface
from controller.cpu_wait import waited_s
from controller.daemon import ControllerConfig
from controller.policies.base import PolicyError
from controller.policies.oracle import CURVES_VAR
from controller.policies.rules import parse_without
from controller.training_processes import MODES
from controller.snapshot import NodeSnapshot


POLL_S = 0.5
GROUP_CPU_SHARES = 64 * 1024


class BenchError(AdloaderError):
    """A benchmark run could not be carried out (controller would not start, a job failed)."""


@dataclass(frozen=True)
class NodeSetup:
    """How the benchmark's controller manages the node."""

    cpus: str = "0-1"
    period_s: float = ControllerConfig.period_s
    settle_period_s: float = ControllerConfig.settle_period_s
    """The controller's own defaults: what a user runs."""
    read_bps: float | None = None
    read_device: str | None = None
    compute: str = "sleep"
    """How each job makes its GPU step: ``sleep`` (GPU-emulated), or ``cuda``/``cpu``: it trains a
    zoo model on its batches there (bench/gpu_step.py)."""
    without: str | None = None
    """For an ablation only: adaptive's rules its controllers run without (``--without``)."""


@dataclass
class JobOutcome:
    spec: JobSpec
    launched_s: float
    """Seconds after the run's start the launcher was started: its arrival, or later where it
    waited for GPUs (a mix giving the node's ``gpus``)."""
    ended_s: float | None = None
    exit_code: int | None = None
    timeline: dict | None = None


@dataclass
class RunOutcome:
    policy: str
    repeat: int
    started_at: float
    """Unix time of the run's start (arrival 0)."""
    jobs: list[JobOutcome]
    controller_cpu_s: float
    wall_s: float
    samples: list[tuple[float, dict[str, dict]]] = field(default_factory=list)
    """(seconds since start, {job name: its status fields}) twice a second, jobs not yet gone."""
    controller_wait_s: float = 0.0
    """Seconds the controller's control loop (its main thread) waited for a CPU."""


Progress = Callable[[str, float, list[JobOutcome], NodeSnapshot | None], None]
"""Called about twice a second: (policy, seconds elapsed, jobs so far, latest status)."""


def run_policy(
    mix: Mix,
    policy: str,
    datasets: dict[str, Path],
    workdir: Path,
    node: NodeSetup,
    *,
    repeat: int = 0,
    oracle_curves: Path | None = None,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    label: str | None = None,
    send_features: bool = True,
    state_dir: Path | None = None,
) -> RunOutcome:
    """Run ``mix`` under ``policy`` on a fresh controller; raises BenchError if it cannot.
    ``policy`` may name how the controller places training processes after an ``@``
    (``adaptive@with-loaders``, ``adaptive~hysteresis``: see :func:`split_variant`).
    ``label`` names the run in results (default: the policy); ``send_features``: jobs that
    name a model send its features at registration; ``state_dir``: the controller's state
    and job history (default: a fresh one in the run's directory)."""
    label = label or policy
    run_dir = workdir / f"{run_dir_name(label)}-{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    os.chmod(run_dir, 0o755)
    name, training, without = split_variant(policy)
    curves = {CURVES_VAR: str(oracle_curves)} if name == "oracle" and oracle_curves is not None else {}
    queue_file = run_dir / "pending.json" if mix.gpus is not None else None
    if queue_file is not None:
        write_pending(queue_file, [])
    controller = ControllerProcess(
        socket=run_dir / "s.sock", state_dir=state_dir or run_dir / "state",
        group=f"adloader-bench-{uuid.uuid4().hex[:8]}", period=node.period_s,
        options=_controller_options(name, training, node, queue_file, without),
        log_path=run_dir / "controller.log", environ=base_environment(**curves),
    )
    cleanup = Cleanup(graceful=True)
    controller.node_cgroup = make_weighted_group(f"{controller.group}-node")
    controller.control_cgroup = make_weighted_group(f"{controller.group}-ctl")
    cleanup.track(controller)
    launchers: dict[str, JobProcess] = {}
    outcomes: list[JobOutcome] = []
    try:
        with running_in(controller.control_cgroup):
            controller.start()
            ctl = psutil.Process(controller.proc.pid)
            cpu_before = _cpu_seconds(ctl)
            wait_before = _wait_seconds(ctl.pid)
            start = time.monotonic()
            started_at = time.time()
            pending = sorted(mix.jobs, key=lambda j: j.arrival_s)
            waiting: list[JobSpec] = []
            told: list[str] | None = None  # the waiting jobs the controller was last told of
            status_samples: list[tuple[float, dict[str, dict]]] = []
            while pending or waiting or any(o.ended_s is None for o in outcomes):
                now = time.monotonic() - start
                if now > timeout_s:
                    raise BenchError(f"{policy}: the mix did not finish within {timeout_s:.0f}s; logs in {run_dir}")
                for outcome in outcomes:
                    if outcome.ended_s is None:
                        code = launchers[outcome.spec.name].proc.poll()
                        if code is not None:
                            outcome.ended_s, outcome.exit_code = time.monotonic() - start, code
                while pending and pending[0].arrival_s <= now:
                    waiting.append(pending.pop(0))
                for spec in starting_now(waiting, free_gpus(mix, outcomes), lambda spec: spec.gpus):
                    waiting.remove(spec)
                    launchers[spec.name] = _launch(controller, spec, datasets[spec.name], run_dir, send_features,
                                                   node.compute)
                    outcomes.append(JobOutcome(spec=spec, launched_s=now))
                if queue_file is not None and told != [spec.name for spec in waiting]:
                    write_pending(queue_file, waiting)
                    told = [spec.name for spec in waiting]
                snapshot = controller.poll_status()
                if controller.proc.poll() is not None:
                    raise BenchError(f"{policy}: the controller exited with {controller.proc.returncode}; "
                                     f"log: {controller.log_path}")
                if snapshot is not None:
                    live = {j.name: _job_fields(j) for j in snapshot.jobs if j.state != "gone"}
                    status_samples.append((round(now, 3), live))
                if progress is not None:
                    progress(label, now, outcomes, snapshot)
                time.sleep(POLL_S)
            wall = time.monotonic() - start
            cpu = _cpu_seconds(ctl) - cpu_before
            waited = _wait_seconds(ctl.pid) - wait_before
    finally:
        cleanup.run()
    failed = [o for o in outcomes if o.exit_code != 0]
    if failed:
        names = ", ".join(f"{o.spec.name} (exit {o.exit_code}, see {launchers[o.spec.name].stderr})" for o in failed)
        raise BenchError(f"{policy}: job(s) failed: {names}")
    for outcome in outcomes:
        outcome.timeline = _read_timeline(run_dir / f"{outcome.spec.name}.timeline.json")
    return RunOutcome(policy=label, repeat=repeat, started_at=started_at, jobs=outcomes, controller_cpu_s=cpu,
                      wall_s=wall, samples=status_samples, controller_wait_s=waited)


def job_command(spec: JobSpec, dataset: Path, timeline: Path, features: Path | None = None,
                compute: str = "sleep") -> list[str]:
    """``adloader run`` of one mix job (sending ``features`` at registration when given; its GPU
    step made as ``compute`` says: NodeSetup.compute)."""
    command = [
        sys.executable, "-m", "adloader", "run", "--name", spec.name, "--gpus", str(spec.gpus),
        "--num-workers", str(spec.num_workers), "--samples", str(spec.samples),
        *(["--model-features", str(features)] if features is not None else []), "--",
        sys.executable, "-m", "bench.job", "--name", spec.name, "--dataset", str(dataset),
        "--image-px", str(spec.image_px), "--batch-size", str(spec.batch_size),
        "--compute-ms", str(spec.compute_ms_per_batch), "--samples", str(spec.samples),
        "--num-workers", str(spec.num_workers), "--timeline", str(timeline),
    ]
    if spec.io_bound:
        command.append("--io-bound")
    if spec.phase_after_s is not None and max(spec.phase_cost, spec.first_phase_cost) > 1:
        command += ["--phase-after-s", str(spec.phase_after_s), "--phase-cost", str(spec.phase_cost),
                    "--first-phase-cost", str(spec.first_phase_cost)]
    if spec.python_ms_per_batch > 0:
        command += ["--python-ms-per-batch", str(spec.python_ms_per_batch)]
    if spec.evaluates:
        command += ["--eval-every-steps", str(spec.eval_every_steps), "--eval-batches", str(spec.eval_batches),
                    "--eval-compute-ms", str(spec.eval_compute_ms_per_batch)]
    if compute != "sleep":
        command += ["--compute", compute]
    return command


def run_dir_name(label: str) -> str:
    """A run's directory name: its label, with an ablation's rules (after ``~``) shortened to their
    checksum, so that the controller's socket inside stays within AF_UNIX's 108 bytes."""
    name, tilde, rules = label.partition("~")
    return f"{name}~{zlib.crc32(rules.encode()):08x}" if tilde else label


def split_variant(policy: str) -> tuple[str, str, str | None]:
    """``"adaptive@with-loaders~hysteresis+safety_net"`` -> ``("adaptive", "with-loaders",
    "hysteresis,safety_net")``: after ``@`` how training processes are placed (default the
    controller's, ``"apart"``), after ``~`` the rules of ``adaptive`` the controller runs without
    (for an ablation, interleaved with the policy itself). BenchError for another placement, an
    unknown rule, or a variant of ``oracle`` (whose split is measured once, under the default)."""
    variant, _, without = policy.partition("~")
    name, _, training = variant.partition("@")
    training = training or MODES[0]
    if training not in MODES:
        raise BenchError(f"{policy}: after '@' name how training processes are placed: {', '.join(MODES)}")
    if name == "oracle" and policy != name:
        raise BenchError(f"{policy}: the oracle runs only under the default placement of training processes")
    if not without:
        return name, training, None
    try:
        rules = parse_without(without.replace("+", ","))
    except PolicyError as error:
        raise BenchError(f"{policy}: after '~' name rules of adaptive joined by '+': {error}") from None
    return name, training, ",".join(rules.off)


def _controller_options(policy: str, training: str, node: NodeSetup, queue_file: Path | None = None,
                        without: str | None = None) -> tuple[str, ...]:
    options = ("--policy", policy, "--cpus", node.cpus, "--backend", "cgroup-v1",
               "--settle-period", str(node.settle_period_s), "--training-processes", training)
    if queue_file is not None:  # what waits for the node's GPUs, as a scheduler would tell it
        options += ("--pending", str(queue_file))
    if node.read_bps is not None and node.read_device is not None:
        options += ("--read-bps", str(int(node.read_bps)), "--read-device", node.read_device)
    rules_off = ",".join(filter(None, (node.without, without)))
    if rules_off:
        options += ("--without", rules_off)
    return options


def free_gpus(mix: Mix, outcomes: list[JobOutcome]) -> int | None:
    """GPUs of the mix's node no running job holds; None where the mix does not model them."""
    if mix.gpus is None:
        return None
    return mix.gpus - sum(o.spec.gpus for o in outcomes if o.ended_s is None)


def write_pending(path: Path, waiting: list[JobSpec]) -> None:
    """The jobs waiting for GPUs, in the controller's pending-queue file format
    (controller/pending_queue.py), replaced atomically: what a scheduler's queue tells the controller."""
    document = {"jobs": [{"name": spec.name, "gpus": spec.gpus, "samples": spec.samples} for spec in waiting]}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


@contextmanager
def running_in(cgroup: Path) -> Iterator[None]:
    """The harness itself in ``cgroup`` (cpu hierarchy) while the block runs, then back where it
    was: its status polls, which time the allocations, are then not starved by the jobs."""
    before = cgroup_of(os.getpid(), "cpu") or "/"
    move_into(cgroup)
    try:
        yield
    finally:
        move_into(CGROUP_ROOT / "cpu" / before.lstrip("/"))


def make_weighted_group(group: str, root: Path = CGROUP_ROOT) -> Path:
    """A cpu group weighted above everything else on the machine: the run's node, in which the
    jobs start (the controller nests its job groups in it, as below a scheduler's cgroup), and
    the controller's own, beside it. ``root``: where the cgroup hierarchies are mounted."""
    directory = root / "cpu" / group
    try:
        directory.mkdir()
    except OSError as exc:
        v2_only = not (root / "cpu").is_dir() and (root / "cgroup.controllers").is_file()
        raise BenchError(
            f"cannot make the benchmark's cgroup {directory} ({exc.strerror}): adloader bench runs real jobs "
            "under a real controller and needs root and cgroup v1's cpu hierarchy at /sys/fs/cgroup/cpu"
            + ("; this machine has cgroup v2 only: on a machine you may reconfigure (it takes cpu, cpuset "
               "and io from every v2 group), `sh bench/gpu_check/cgroup_v1_beside_v2.sh` mounts v1 beside it"
               if v2_only else "")
        ) from None
    write_interface(directory / "cpu.shares", str(GROUP_CPU_SHARES), "weighting the benchmark's group")
    return directory


def _launch(controller: ControllerProcess, spec: JobSpec, dataset: Path, run_dir: Path, send_features: bool,
            compute: str) -> JobProcess:
    timeline = run_dir / f"{spec.name}.timeline.json"
    features = write_features(spec, run_dir) if send_features and spec.model is not None else None
    return controller.launch(job_command(spec, dataset, timeline, features, compute), name=spec.name)


def _job_fields(job) -> dict:
    return {"cores": job.cores, "cpu_weight": job.cpu_weight, "workers": job.workers_target,
            "read_bps": job.read_bps, "state": job.state,
            "achieved_sps": job.achieved_sps, "data_wait_ratio": job.data_wait_ratio,
            "worker_memory_bytes": job.worker_memory_bytes, "worker_prefetch_bytes": job.worker_prefetch_bytes,
            "worker_memory_exact": job.worker_memory_exact, "workers_memory_limit": job.workers_memory_limit}


def _wait_seconds(pid: int) -> float:
    """Seconds the process's main thread (the controller's control loop) waited for a CPU so far."""
    return waited_s(Path("/proc") / str(pid) / "schedstat") or 0.0


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _read_timeline(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"job timeline {path} is missing or unreadable ({exc}); see the job's .err file") from None
