"""One benchmark run: a real controller under one policy, the mix's jobs launched through
``adloader run`` at their arrival times, and what came out of it.

Everything is real: the controller is ``python -m adloader controller`` with its own
socket, state directory and cgroup group (``adloader-bench-<uuid8>``); each job is
``python -m adloader run ... -- python -m bench.job ...``, which writes its timeline.
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
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from adloader import protocol
from adloader.client import ControllerClient
from adloader.errors import AdloaderError
from bench.mix import JobSpec, Mix
from bench.model_jobs import write_features
from controller.backends.cgroupfs import drain_and_rmdir, read_pid_list, write_interface
from controller.policies.oracle import CURVES_VAR
from controller.snapshot import NodeSnapshot

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
CGROUP_ROOT = Path("/sys/fs/cgroup")
HIERARCHIES = ("cpu", "cpuacct", "cpuset", "blkio")
POLL_S = 0.5
GROUP_CPU_SHARES = 64 * 1024


class BenchError(AdloaderError):
    """A benchmark run could not be carried out (controller would not start, a job failed)."""


@dataclass(frozen=True)
class NodeSetup:
    """How the benchmark's controller manages the node."""

    cpus: str = "0-1"
    period_s: float = 0.5
    read_bps: float | None = None
    read_device: str | None = None


@dataclass
class JobOutcome:
    spec: JobSpec
    launched_s: float
    """Seconds after the run's start the launcher was started."""
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
    ``label`` names the run in results (default: the policy); ``send_features``: jobs that
    name a model send its features at registration; ``state_dir``: the controller's state
    and job history (default: a fresh one in the run's directory)."""
    label = label or policy
    run_dir = workdir / f"{label}-{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    os.chmod(run_dir, 0o755)
    group = f"adloader-bench-{uuid.uuid4().hex[:8]}"
    socket_path = run_dir / "s.sock"
    environ = _environment(socket_path, oracle_curves if policy == "oracle" else None)
    _make_group(group)
    controller = _start_controller(policy, node, socket_path, run_dir, state_dir or run_dir / "state", group,
                                   environ)
    launchers: dict[str, subprocess.Popen] = {}
    outcomes: list[JobOutcome] = []
    try:
        ctl = psutil.Process(controller.pid)
        cpu_before = _cpu_seconds(ctl)
        start = time.monotonic()
        started_at = time.time()
        pending = sorted(mix.jobs, key=lambda j: j.arrival_s)
        status_samples: list[tuple[float, dict[str, dict]]] = []
        while pending or any(o.ended_s is None for o in outcomes):
            now = time.monotonic() - start
            if now > timeout_s:
                raise BenchError(f"{policy}: the mix did not finish within {timeout_s:.0f}s; logs in {run_dir}")
            while pending and pending[0].arrival_s <= now:
                spec = pending.pop(0)
                launchers[spec.name] = _launch(spec, datasets[spec.name], run_dir, environ, send_features)
                outcomes.append(JobOutcome(spec=spec, launched_s=now))
            for outcome in outcomes:
                if outcome.ended_s is None:
                    code = launchers[outcome.spec.name].poll()
                    if code is not None:
                        outcome.ended_s, outcome.exit_code = time.monotonic() - start, code
            snapshot = _status(socket_path)
            if controller.poll() is not None:
                raise BenchError(f"{policy}: the controller exited with {controller.returncode}; "
                                 f"log: {run_dir / 'controller.log'}")
            if snapshot is not None:
                live = {j.name: _job_fields(j) for j in snapshot.jobs if j.state != "gone"}
                status_samples.append((round(now, 3), live))
            if progress is not None:
                progress(label, now, outcomes, snapshot)
            time.sleep(POLL_S)
        wall = time.monotonic() - start
        cpu = _cpu_seconds(ctl) - cpu_before
    finally:
        _stop(controller, launchers, group)
    failed = [o for o in outcomes if o.exit_code != 0]
    if failed:
        names = ", ".join(f"{o.spec.name} (exit {o.exit_code})" for o in failed)
        raise BenchError(f"{policy}: job(s) failed: {names}; see {run_dir}/*.err")
    for outcome in outcomes:
        outcome.timeline = _read_timeline(run_dir / f"{outcome.spec.name}.timeline.json")
    return RunOutcome(policy=label, repeat=repeat, started_at=started_at, jobs=outcomes, controller_cpu_s=cpu,
                      wall_s=wall, samples=status_samples)


def job_command(spec: JobSpec, dataset: Path, timeline: Path, features: Path | None = None) -> list[str]:
    """``adloader run`` of one mix job (sending ``features`` at registration when given)."""
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
    if spec.phase_after_s is not None and spec.phase_cost > 1:
        command += ["--phase-after-s", str(spec.phase_after_s), "--phase-cost", str(spec.phase_cost)]
    if spec.python_ms_per_batch > 0:
        command += ["--python-ms-per-batch", str(spec.python_ms_per_batch)]
    return command


def _environment(socket_path: Path, oracle_curves: Path | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ADLOADER_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ["ADLOADER_SOCKET"] = str(socket_path)
    if oracle_curves is not None:
        environ[CURVES_VAR] = str(oracle_curves)
    return environ


def _start_controller(policy: str, node: NodeSetup, socket_path: Path, run_dir: Path, state_dir: Path, group: str,
                      environ: dict[str, str]) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "adloader", "--log-level", "DEBUG", "controller", "--policy", policy,
        "--socket", str(socket_path),
        "--state-dir", str(state_dir), "--cgroup-group", group, "--cpus", node.cpus,
        "--period", str(node.period_s), "--backend", "cgroup-v1",
    ]
    if node.read_bps is not None and node.read_device is not None:
        command += ["--read-bps", str(int(node.read_bps)), "--read-device", node.read_device]
    with (run_dir / "controller.log").open("w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=environ,
                                start_new_session=True)
    deadline = time.monotonic() + 30.0
    while _status(socket_path) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc, {}, group)
            raise BenchError(f"the {policy} controller did not start; log:\n{(run_dir / 'controller.log').read_text()}")
        time.sleep(0.1)
    return proc


def _make_group(group: str) -> None:
    """The run's cpu group, weighted above everything else on the machine."""
    directory = CGROUP_ROOT / "cpu" / group
    try:
        directory.mkdir()
    except OSError as exc:
        raise BenchError(
            f"cannot make the benchmark's cgroup {directory} ({exc.strerror}): adloader bench runs real jobs "
            "under a real controller and needs root and cgroup v1's cpu hierarchy at /sys/fs/cgroup/cpu"
        ) from None
    write_interface(directory / "cpu.shares", str(GROUP_CPU_SHARES), "weighting the benchmark's group")


def _launch(spec: JobSpec, dataset: Path, run_dir: Path, environ: dict[str, str], send_features: bool
            ) -> subprocess.Popen:
    timeline = run_dir / f"{spec.name}.timeline.json"
    features = write_features(spec, run_dir) if send_features and spec.model is not None else None
    with (run_dir / f"{spec.name}.out").open("w") as out, (run_dir / f"{spec.name}.err").open("w") as err:
        return subprocess.Popen(job_command(spec, dataset, timeline, features), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, cwd=REPO, env=environ, start_new_session=True)


def _status(socket_path: Path) -> NodeSnapshot | None:
    try:
        with ControllerClient(socket_path, timeout=5.0) as client:
            reply = client.request(protocol.StatusRequest())
    except (AdloaderError, OSError):
        return None
    if not isinstance(reply, protocol.Status):
        return None
    return reply.node


def _job_fields(job) -> dict:
    return {"cores": job.cores, "cpu_weight": job.cpu_weight, "workers": job.workers_target,
            "read_bps": job.read_bps, "state": job.state,
            "achieved_sps": job.achieved_sps, "data_wait_ratio": job.data_wait_ratio}


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _read_timeline(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"job timeline {path} is missing or unreadable ({exc}); see the job's .err file") from None


def _stop(controller: subprocess.Popen, launchers: dict[str, subprocess.Popen], group: str) -> None:
    """End everything the run started: launchers' sessions, the controller, the cgroups."""
    for proc in launchers.values():
        if proc.poll() is None:
            _kill_session(proc)
    if controller.poll() is None:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(15.0)
        except subprocess.TimeoutExpired:
            _kill_session(controller)
    _remove_group(group)


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _remove_group(group: str) -> None:
    """Kill whatever is left in the run's cgroups and remove them."""
    for hierarchy in HIERARCHIES:
        group_dir = CGROUP_ROOT / hierarchy / group
        if not group_dir.is_dir():
            continue
        root_procs = CGROUP_ROOT / hierarchy / "cgroup.procs"
        for directory in [d for d in group_dir.iterdir() if d.is_dir()] + [group_dir]:
            for pid in read_pid_list(directory / "cgroup.procs"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            drain_and_rmdir(directory, lambda d=directory: read_pid_list(d / "cgroup.procs"),
                            lambda pid: write_interface(root_procs, str(pid), "bench cleanup"))
