"""One owner per cgroup group and per state directory, and a clean stop: real controller
processes, real jobs, real clients connected while SIGTERM arrives."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from adloader import paths, protocol
from adloader.client import ControllerClient
from bench.controller_process import REPO, ControllerProcess, base_environment, wait_until

SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


def _second_controller(socket: Path, state_dir: Path, group: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "adloader", "controller", "--socket", str(socket), "--state-dir", str(state_dir),
         "--cgroup-group", group, "--policy", "even", "--cpus", "0"],
        capture_output=True, text=True, timeout=60, cwd=REPO, env=base_environment(),
    )


def test_a_second_controller_on_the_same_group_refuses_naming_the_holder_and_leaves_its_job_alone(
    controller: ControllerProcess, tmp_path: Path,
) -> None:
    job = controller.run(*SLEEP, name="owned")
    job_id = controller.registered(job).job_id
    wait_until(lambda: controller.read("cpu", job_id, "cpu.cfs_quota_us") != "-1", 10, "the job's quota")
    quota = controller.read("cpu", job_id, "cpu.cfs_quota_us")

    second = _second_controller(tmp_path / "other.sock", tmp_path / "other-state", controller.group)

    assert second.returncode == 1, second.stderr
    assert f"cgroup group {controller.group!r} is already managed by controller pid {controller.proc.pid}" \
        in second.stderr
    assert str(controller.socket) in second.stderr and "--cgroup-group" in second.stderr
    assert "Traceback" not in second.stderr
    assert not (tmp_path / "other.sock").exists()
    # The first controller's job is untouched: same limits, still in its group, still listed.
    assert controller.read("cpu", job_id, "cpu.cfs_quota_us") == quota
    assert job.pid in controller.group_pids(job_id)
    assert [j.job_id for j in controller.status().jobs] == [job_id]


def test_a_second_controller_on_the_same_state_directory_refuses(
    controller: ControllerProcess, tmp_path: Path,
) -> None:
    second = _second_controller(tmp_path / "other.sock", controller.state_dir, controller.group + "-other")
    assert second.returncode == 1, second.stderr
    assert f"state directory {controller.state_dir} is already managed by controller pid {controller.proc.pid}" \
        in second.stderr
    assert not Path("/sys/fs/cgroup/cpu", controller.group + "-other").exists()


def test_the_lock_names_its_holder_and_goes_with_a_clean_stop_or_a_crash(
    start_controller: Callable[..., ControllerProcess], tmp_path: Path,
) -> None:
    controller = start_controller("--policy", "even", "--cpus", "0")
    lock = paths.default_lock_dir() / f"group-{controller.group}.lock"
    holder = json.loads(lock.read_text())
    assert holder == {"pid": controller.proc.pid, "socket": str(controller.socket),
                      "state_dir": str(controller.state_dir), "group": controller.group}
    assert controller.stop() == 0
    assert not lock.exists() and not (controller.state_dir / "controller.lock").exists()
    controller.start()
    controller.kill()  # SIGKILL: the kernel drops the lock; the file stays and is taken again
    controller.start()
    assert json.loads(lock.read_text())["pid"] == controller.proc.pid


def test_sigterm_with_clients_connected_stops_without_a_traceback(
    controller: ControllerProcess, tmp_path: Path,
) -> None:
    job = controller.run(*SLEEP, name="connected")
    job_id = controller.registered(job).job_id
    reporter = ControllerClient(controller.socket)  # a loader's persistent connection, mid-conversation
    reporter.request(protocol.StatusRequest())
    idle = ControllerClient(controller.socket)  # connected, never sent a byte
    idle.connect()
    watch = subprocess.Popen(
        [sys.executable, "-m", "adloader", "status", "--watch", "0.2", "--socket", str(controller.socket)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=base_environment(),
    )
    try:
        wait_until(lambda: controller.status().connected_clients >= 4, 20, "four clients connected")
        time.sleep(0.3)
        assert controller.stop(signal.SIGTERM) == 0
    finally:
        watch.kill()
        watch.wait()
        reporter.close()
        idle.close()
    log = controller.log()
    assert "stopped; 1 job(s) left running unmanaged" in log, log
    assert "Traceback" not in log and "CancelledError" not in log and " ERROR " not in log, log
    assert job.proc.poll() is None and job_id in log
