"""The loader's reporter against a real controller: a job under ``adloader run`` reports its
loader counters, follows the controller's worker target, and rides out a controller restart."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from adloader import DataLoader
from adloader.reporter import Reporter
from controller.history import JobHistory
from controller.node_memory import HISTORY_FILE

from bench.controller_process import REPO, ControllerProcess, base_environment, wait_until

SCRIPT = REPO / "tests" / "loader_job.py"


def _run_job(controller: ControllerProcess, out: Path, *extra: str):
    """The job trains until the test creates ``out``/stop (its lifetime must outlast a loaded machine)."""
    return controller.run(sys.executable, str(SCRIPT), "--out", str(out), "--seconds", "120",
                          "--stop-file", str(out / "stop"), *extra, name="loader-job")


@pytest.mark.slow
def test_a_job_reports_its_loader_and_follows_the_worker_target(controller: ControllerProcess, tmp_path: Path) -> None:
    job = _run_job(controller, tmp_path, "--workers", "3")
    job_id = controller.registered(job).job_id

    def target_applied():
        snap = controller.job(job_id)
        if snap and snap.samples_total > 0 and snap.workers_target is not None \
                and snap.workers_running == snap.workers_target:
            return snap
        return None

    snap = wait_until(target_applied, 30.0, f"the loader to report and follow its target; log:\n{controller.log()}")
    assert snap.workers_target < 3, "one core (--cpus 0) under the even policy asks for fewer workers"
    assert snap.ranks_reporting == 1 and snap.batch_size == 4
    assert snap.loader_cpu_seconds_total > 0 and snap.compute_seconds_total > 0
    assert snap.loader_load_seconds_total > 0, "the workers' loading time reaches the status"
    (tmp_path / "stop").touch()
    assert job.wait(60) == 0, job.output()
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["num_workers"] == snap.workers_target
    # The job's own output says once that it got fewer workers than it asked for, and why.
    (told,) = [line for line in job.output()[1].splitlines() if "fewer than the 3 it asked for" in line]
    assert told.endswith(f"{snap.workers_target} loader worker, fewer than the 3 it asked for: the even policy "
                         "gives this job 1.0 cores (a CPU quota), and workers follow cores"), told
    assert all(epoch == list(range(400)) for epoch in result["epochs"])
    assert result["counters"]["samples"] == 400 * len(result["epochs"])
    # The reporter's last report at exit makes the node's history count every sample, exactly.
    history = JobHistory(controller.state_dir / HISTORY_FILE)
    (recorded,) = wait_until(lambda: list(history), 10.0, "the finished job in the node's history")
    assert (recorded.job_id, recorded.exit_code, recorded.samples) == (job_id, 0, result["counters"]["samples"])


@pytest.mark.slow
def test_the_reporter_rides_out_a_controller_restart(controller: ControllerProcess, tmp_path: Path) -> None:
    job = _run_job(controller, tmp_path, "--workers", "2")
    job_id = controller.registered(job).job_id
    before = wait_until(lambda: (s := controller.job(job_id)) and s.samples_total > 0 and s, 30.0, "a first report")
    controller.kill()
    wait_until(lambda: "lost the controller" in job.output()[1], 15.0, "the reporter to notice")
    controller.start()
    wait_until(lambda: (s := controller.job(job_id)) and s.samples_total > before.samples_total, 30.0,
               f"reports to resume after the restart; log:\n{controller.log()}")
    (tmp_path / "stop").touch()
    assert job.wait(60) == 0, job.output()
    _, err = job.output()
    assert err.count("adloader: lost the controller") == 1, err
    assert err.count("adloader: reconnected to the controller") == 1, err
    assert "Traceback" not in err
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert all(epoch == list(range(400)) for epoch in result["epochs"])


def test_with_no_controller_listening_training_runs_and_says_so_once(tmp_path: Path) -> None:
    environ = base_environment(ADLOADER_SOCKET=str(tmp_path / "nobody.sock"), ADLOADER_JOB_ID="j-absent")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--seconds", "2.5", "--workers", "2"],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("adloader: no controller answers") == 1, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["num_workers"] == 2, "with nobody to ask, the loader keeps its configured count"
    assert all(epoch == list(range(400)) for epoch in result["epochs"])


class Numbers(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def test_several_loaders_are_summed_and_the_last_active_one_speaks(tmp_path: Path) -> None:
    reporter = Reporter(str(tmp_path / "nobody.sock"), "job-x", rank=1, world_size=2, interval=60.0)
    train = DataLoader(Numbers(40), batch_size=4, num_workers=1)
    val = DataLoader(Numbers(10), batch_size=5, num_workers=0)
    try:
        reporter.add(train)
        reporter.add(val)
        list(train)
        first = reporter.build_report()
        assert (first.batches, first.samples, first.batch_size, first.rank, first.world_size) == (10, 40, 4, 1, 2)
        list(val)
        second = reporter.build_report()
        assert (second.batches, second.samples, second.batch_size) == (12, 50, 5), "val is the active loader now"
        assert second.worker_cpu_s >= first.worker_cpu_s > 0 and second.data_wait_s >= first.data_wait_s
        del val
        gc.collect()
        third = reporter.build_report()
        assert (third.batches, third.samples) == (12, 50), "a finished loader's counts stay in the sums"
        assert third.batch_size == 4, "the surviving loader speaks again"
    finally:
        reporter.stop()


def test_described_features_go_with_the_reports_until_the_controller_has_answered_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from adloader import reporter as reporter_module
    from adloader.errors import ControllerUnavailable

    monkeypatch.setattr(reporter_module, "_model_features", None)  # this process's announcement, undone after
    monkeypatch.setattr(reporter_module, "_features_delivered", threading.Event())
    sender = Reporter(str(tmp_path / "nobody.sock"), "job-x", interval=60.0)
    assert sender.build_report().features is None
    reporter_module.announce_features({"flops": 2e9, "params": 1e6})
    assert sender.build_report().features == {"flops": 2e9, "params": 1e6}
    with pytest.raises(ControllerUnavailable):
        sender.report_once()
    assert sender.build_report().features == {"flops": 2e9, "params": 1e6}  # not delivered: sent again
    sender.stop()


class _LosesItsFirstTarget:
    """A loader whose first ``set_num_workers`` sets the target but misses the workers, as
    adloader's did when the target came while ``iter()`` started them."""

    def __init__(self, workers: int) -> None:
        from adloader.dataloader.stats import LoaderCounters

        self.counters, self.batch_size = LoaderCounters(), 4
        self.num_workers = self.running = workers
        self.calls = 0

    def running_workers(self) -> int:
        return self.running

    def loader_pids(self) -> list[int]:
        return []

    def set_num_workers(self, n: int) -> None:
        self.num_workers, self.calls = n, self.calls + 1
        if self.calls > 1:
            self.running = n


def test_a_target_that_missed_the_workers_is_set_again_at_the_next_report(tmp_path: Path) -> None:
    """The reporter compares the target with what runs, not only with what it last set."""
    import socket

    from adloader import protocol

    path = str(tmp_path / "controller.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    reports: list[protocol.Message] = []

    def answer_every_report_with_one_worker() -> None:
        connection, _ = server.accept()
        with connection, connection.makefile("rb") as lines:
            for line in lines:
                reports.append(protocol.decode(line))
                connection.sendall(protocol.encode(protocol.Target(num_workers=1)))

    controller = threading.Thread(target=answer_every_report_with_one_worker, daemon=True)
    controller.start()
    reporter = Reporter(path, "job-x", interval=0.05)
    loader = _LosesItsFirstTarget(workers=2)
    try:
        reporter.add(loader)  # starts the reporter's thread
        wait_until(lambda: len(reports) >= 4, 30.0, "four reports")
        assert (loader.num_workers, loader.running) == (1, 1), "the workers kept running against a target of 1"
        assert loader.calls == 2, "set once more, then left alone once it runs"
        assert [r.num_workers for r in reports[:2]] == [2, 2] and reports[3].num_workers == 1
    finally:
        reporter.stop()
        server.close()


def test_reports_name_the_processes_every_loader_loads_in(tmp_path: Path) -> None:
    """Workers and the helpers that fork them, of every live loader: the controller keeps exactly
    these of the rank's processes in the job's CPU group (controller/training_processes.py)."""
    import os

    from controller.processes import ancestors

    reporter = Reporter(str(tmp_path / "nobody.sock"), "job-x", interval=60.0)
    train = DataLoader(Numbers(40), batch_size=4, num_workers=2, persistent_workers=True)
    val = DataLoader(Numbers(10), batch_size=5, num_workers=1, persistent_workers=True)
    try:
        reporter.add(train)
        reporter.add(val)
        helpers = [iter(train).source.spawner_pid(), iter(val).source.spawner_pid()]
        wait_until(lambda: len(train.worker_pids()) == 2 and len(val.worker_pids()) == 1, 30.0, "the workers")
        pids = reporter.build_report().loader_pids
        assert pids == tuple(sorted(train.worker_pids() + val.worker_pids() + helpers))
        assert all(os.getpid() in ancestors(pid) for pid in pids), "each descends from the rank"
    finally:
        reporter.stop()
        train.close()
        val.close()
