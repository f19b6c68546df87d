"""The controller predicts a job's M from its model features, records finished jobs in the
node's SQLite history, and gives a recurring job its length and M from that history.

Real controller subprocess, real ``adloader run`` jobs reporting over the socket, the real
history file in the controller's state directory."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from adloader import describe_model
from controller.history import JobHistory
from controller.node_memory import CORPUS_FILE, HISTORY_FILE, NodeMemory, detect_device
from throughput_model.corpus import cpu_model_name, load_corpus
from bench.controller_process import ControllerProcess, wait_until

REPORTING_JOB = str(Path(__file__).with_name("reporting_job.py"))
LOADER_JOB = str(Path(__file__).with_name("loader_job.py"))


def _features_file(tmp_path: Path) -> tuple[Path, dict[str, float]]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    features = describe_model(model, torch.zeros(32, 64))
    path = tmp_path / "features.json"
    path.write_text(json.dumps(features))
    return path, features


def test_a_job_that_describes_its_model_gets_a_prediction_without_a_features_file(
    start_controller: Callable[..., ControllerProcess], tmp_path: Path
) -> None:
    controller = start_controller("--policy", "even", "--cpus", "0", "--device", "cpu")
    command = (sys.executable, LOADER_JOB, "--describe", "--workers", "1", "--seconds", "600", "--out", str(tmp_path))
    job = controller.run(*command, name="describes-itself")
    assert controller.registered(job).max_sps_predicted is None  # registered without features
    snapshot = wait_until(lambda: next((j for j in controller.status().jobs
                                        if j.launcher_pid == job.pid and j.max_sps_predicted), None),
                          90.0, "the M predicted from the features its reports carried")
    assert snapshot.max_sps_predicted > 0


def test_prediction_history_and_recurrence_end_to_end(
    start_controller: Callable[..., ControllerProcess], tmp_path: Path
) -> None:
    """A completed run gives its exact sample count and length to the next run of the same job;
    a killed run is recorded with its exit status and changes neither."""
    controller = start_controller("--policy", "even", "--cpus", "0", "--device", "cpu")
    features_path, features = _features_file(tmp_path)
    options = ("--model-features", str(features_path))
    # Each job trains until the test stops it: on a loaded machine the model's first load can
    # take longer than a short job lives.
    stop = tmp_path / "stop"
    command = (sys.executable, REPORTING_JOB, "--seconds", "600", "--compute-s", "0.01", "--report-every", "1",
               "--stop-file", str(stop))

    first = controller.run(*command, name="mlp", options=options)
    controller.registered(first)
    # The model loads off the event loop; the job gets its prediction within a few periods.
    snapshot = wait_until(lambda: next((j for j in controller.status().jobs
                                        if j.launcher_pid == first.pid and j.max_sps_predicted), None),
                          60.0, "the job's predicted M")
    assert snapshot.max_sps_predicted > 0
    low, high = snapshot.max_sps_predicted_interval or (None, None)
    assert low is not None and high is not None and low <= snapshot.max_sps_predicted <= high
    wait_until(lambda: any(j.launcher_pid == first.pid and j.samples_total > 0 for j in controller.status().jobs),
               30.0, "the first job's reports")
    stop.touch()
    assert first.wait() == 0, first.output()
    trained = int(first.output()[0].split("samples=")[1])
    stop.unlink()

    history = JobHistory(controller.state_dir / HISTORY_FILE)
    recorded = wait_until(lambda: history.lookup("mlp", features), 10.0, "the finished job in the history")
    assert (recorded.runs, recorded.completed_runs) == (1, 1) and recorded.max_throughput
    assert recorded.samples == trained  # exactly: the job's last report carries its final count

    second = controller.run(*command, name="mlp", options=options)
    again = controller.registered(second)
    assert f"the node's history expects {trained} samples" in controller.log()
    # The recurring job's first estimate is the M its earlier run measured, not the model's.
    assert again.max_sps_predicted == pytest.approx(recorded.max_throughput)
    wait_until(lambda: any(j.launcher_pid == second.pid and j.samples_total > 0 for j in controller.status().jobs),
               30.0, "the second job's reports")
    second.signal(signal.SIGTERM)
    assert second.wait() == 128 + signal.SIGTERM

    wait_until(lambda: len(history) == 2, 10.0, "the killed job in the history")
    assert [run.exit_code for run in history] == [0, 128 + signal.SIGTERM]
    after = history.lookup("mlp", features)
    assert (after.runs, after.completed_runs, after.samples) == (2, 1, trained)  # the killed run's count is no length


def test_an_unwritable_state_dir_leaves_prediction_working_without_history(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    memory = NodeMemory(blocked, "cpu")  # the history cannot live under a file
    assert memory.history is None
    assert memory.recall("mlp", {"flops": 1.0}) is None


def test_device_detection_reads_the_nvidia_driver_model_name(tmp_path: Path) -> None:
    assert detect_device(tmp_path) == "cpu"
    info = tmp_path / "driver" / "nvidia" / "gpus" / "0000:17:00.0" / "information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:  \t\t 1\n")
    assert detect_device(tmp_path) == "NVIDIA H100 80GB HBM3"


def _prediction(memory: NodeMemory, features: dict[str, float]) -> tuple[float, float, float]:
    """The node's answer once its predictor has loaded (the first calls answer None meanwhile)."""
    return wait_until(lambda: memory.predict(features, 1), 60.0, "the predictor to load")


def test_a_node_profiled_on_its_own_cpu_predicts_from_its_own_corpus(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``adloader model profile --out <state-dir>/corpus.json`` makes the node fit the model on its
    own CPU's measurements. Stood in for by the shipped corpus with every step measured twice as
    slow: the node's predicted M halves; an unreadable one is said and the shipped one used."""
    _, features = _features_file(tmp_path)
    shipped_dir, own_dir, broken_dir = (tmp_path / name for name in ("shipped", "own", "broken"))
    for directory in (shipped_dir, own_dir, broken_dir):
        directory.mkdir()
    corpus = load_corpus()
    for point in corpus["points"]:
        point["step_s"] *= 2.0
    (own_dir / CORPUS_FILE).write_text(json.dumps({**corpus, "cpu_model": "this node's CPU"}))
    (broken_dir / CORPUS_FILE).write_text("{not json")

    with caplog.at_level("INFO", logger="controller.node_memory"):
        shipped = _prediction(NodeMemory(shipped_dir, "cpu"), features)
        own = _prediction(NodeMemory(own_dir, "cpu"), features)
        broken = _prediction(NodeMemory(broken_dir, "cpu"), features)
    assert own[0] == pytest.approx(shipped[0] / 2.0, rel=1e-6)
    assert broken == pytest.approx(shipped)
    assert f"fitted on this node's corpus {own_dir / CORPUS_FILE} (profiled on this node's CPU)" in caplog.text
    assert f"predicting from the shipped corpus: profile this CPU once while it is idle (10-20 min): " \
           f"adloader model profile --out {broken_dir / CORPUS_FILE}" in caplog.text
    foreign = "the throughput model's shipped corpus was profiled on another CPU"
    # said, with the command that fixes it, by the node without a corpus of its own where its CPU is another
    assert caplog.text.count(foreign) == (1 if cpu_model_name() != load_corpus()["cpu_model"] else 0)
