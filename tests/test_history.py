"""Job history in a real SQLite file, and the predictor that learns from it."""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from controller.history import FinishedJob, JobHistory, features_key
from controller.prediction import ThroughputPredictor, history_ratios, predicted_max_throughput
from controller.snapshot import JobSnapshot
from throughput_model.predict import predict
from throughput_model.zoo import classification_loss, zoo_model
from throughput_model.features import describe


@pytest.fixture(scope="module")
def mlp_features() -> dict[str, float]:
    spec = zoo_model("mlp-w256-d2")
    return describe(spec.make(), spec.batch(64), loss_fn=classification_loss, optimizer=spec.optimizer).features


@pytest.fixture(scope="module")
def encoder_features() -> dict[str, float]:
    spec = zoo_model("encoder-d128-l2-h4-s64")
    return describe(spec.make(), spec.batch(8), loss_fn=classification_loss, optimizer=spec.optimizer).features


def _snapshot(name: str, samples: int, measured: float | None, registered_at: float = 1000.0) -> JobSnapshot:
    return JobSnapshot(
        job_id=f"{name}-{samples}", name=name, uid=0, gpus=1, state="gone", launcher_pid=1, pids=(), cgroup="",
        registered_at=registered_at, batch_size=64, max_sps_predicted=100.0, max_sps_measured=measured,
        samples_total=samples, loader_cpu_seconds_total=samples * 0.002, read_bytes_total=samples * 150_000,
    )


def test_round_trip_through_a_real_sqlite_file(tmp_path, mlp_features) -> None:
    path = tmp_path / "state" / "history.sqlite"
    history = JobHistory(path)
    curve = ((1.0, 400.0), (2.0, 700.0))
    for samples, measured, end in [(10_000, 900.0, 1100.0), (12_000, 1000.0, 1130.0), (11_000, 950.0, 1120.0)]:
        history.record(FinishedJob.from_snapshot(_snapshot("resnet", samples, measured), exit_code=0,
                                                 features=mlp_features, loading_curve=curve, device="cpu",
                                                 finished_at=end))
    reopened = JobHistory(path)  # a restarted controller sees the same history
    assert len(reopened) == 3
    estimate = reopened.lookup("resnet", mlp_features)
    assert estimate is not None
    assert estimate.runs == 3
    assert estimate.samples == 11_000
    assert estimate.duration_s == pytest.approx(120.0)
    assert estimate.max_throughput == 950.0
    assert estimate.max_throughput_range == (900.0, 1000.0)
    assert estimate.cpu_s_per_sample == pytest.approx(0.002)
    assert estimate.bytes_per_sample == pytest.approx(150_000)
    assert estimate.loading_curve == curve
    stored = list(reopened)
    assert stored[0].features == mlp_features
    assert stored[0].device == "cpu" and stored[0].exit_code == 0 and stored[0].completed
    with sqlite3.connect(path) as connection:  # it is a plain SQLite file an operator can query
        assert connection.execute("SELECT COUNT(*) FROM jobs WHERE name = 'resnet'").fetchone()[0] == 3


def test_lookup_needs_the_same_name_and_features(tmp_path, mlp_features, encoder_features) -> None:
    history = JobHistory(tmp_path / "h.sqlite")
    history.record(FinishedJob.from_snapshot(_snapshot("a", 500, 80.0), features=mlp_features, finished_at=1010.0))
    assert history.lookup("a", encoder_features) is None
    assert history.lookup("b", mlp_features) is None
    assert history.lookup("a", mlp_features) is not None
    by_name = history.lookup("a", None)
    assert by_name is not None and by_name.runs == 1
    relaunched = dict(mlp_features, gpus=4.0, allreduce_bytes=123.0)  # same job on more GPUs
    assert features_key(relaunched) == features_key(mlp_features)


def test_runs_without_samples_do_not_count(tmp_path, mlp_features) -> None:
    history = JobHistory(tmp_path / "h.sqlite")
    history.record(FinishedJob.from_snapshot(_snapshot("crashed", 0, None), features=mlp_features, finished_at=1001.0))
    assert history.lookup("crashed", mlp_features) is None
    assert len(history) == 1


def test_only_completed_runs_give_the_length_but_every_run_its_measurements(tmp_path, mlp_features) -> None:
    history = JobHistory(tmp_path / "h.sqlite")
    runs = [(8_000, 0, 1100.0), (3_100, 1, 1040.0), (5_200, 137, 1060.0), (2_000, None, 1020.0), (8_000, 0, 1090.0)]
    for samples, exit_code, end in runs:  # completed, failed, killed (SIGKILL), launcher vanished, completed
        history.record(FinishedJob.from_snapshot(_snapshot("bert", samples, 500.0 + samples / 1000),
                                                 exit_code=exit_code, features=mlp_features, finished_at=end))
    estimate = history.lookup("bert", mlp_features)
    assert (estimate.runs, estimate.completed_runs, estimate.samples) == (5, 2, 8_000)
    assert estimate.duration_s == pytest.approx(95.0)  # the completed runs' 100 s and 90 s
    assert estimate.max_throughput == pytest.approx(505.2)  # the median over all five runs' measured M
    assert [run.exit_code for run in history] == [0, 1, 137, None, 0]

    history.record(FinishedJob.from_snapshot(_snapshot("flaky", 4_000, 300.0), exit_code=1, features=mlp_features,
                                             finished_at=1010.0))
    flaky = history.lookup("flaky", mlp_features)
    assert (flaky.completed_runs, flaky.samples, flaky.duration_s) == (0, None, None) and flaky.max_throughput == 300.0


def _older_history(path: Path, version: int) -> None:
    """A history file as ``version`` wrote it (1: no exit codes; 2: no declared lengths), holding
    one run of job 'old' (completed, where version 2 says so)."""
    exit_code = ", exit_code INTEGER" if version >= 2 else ""
    with sqlite3.connect(path) as connection:
        connection.executescript(f"""
            CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, name TEXT NOT NULL,
                features_key TEXT, features TEXT, device TEXT NOT NULL DEFAULT '', gpus INTEGER NOT NULL,
                batch_size INTEGER, predicted_sps REAL, measured_sps REAL, cpu_s_per_sample REAL,
                bytes_per_sample REAL, samples INTEGER NOT NULL, duration_s REAL NOT NULL,
                loading_curve TEXT NOT NULL DEFAULT '[]', finished_at REAL NOT NULL{exit_code});
            INSERT INTO jobs (job_id, name, gpus, measured_sps, samples, duration_s, finished_at{exit_code[:11]})
                VALUES ('j1', 'old', 1, 200.0, 7800, 60.0, 1060.0{", 0" if exit_code else ""});
            PRAGMA user_version = {version};
        """)


def test_a_version_1_history_is_migrated_with_exit_status_unknown(tmp_path, mlp_features) -> None:
    path = tmp_path / "h.sqlite"
    _older_history(path, 1)
    history = JobHistory(path)
    (old,) = list(history)
    assert old.exit_code is None and not old.completed
    estimate = history.lookup("old", None)
    assert (estimate.runs, estimate.completed_runs, estimate.samples, estimate.max_throughput) == (1, 0, None, 200.0)
    history.record(FinishedJob.from_snapshot(_snapshot("old", 8_000, 210.0), exit_code=0, finished_at=1100.0))
    assert history.lookup("old", None).samples == 8_000


def test_a_version_2_history_is_migrated_with_declared_lengths_unknown(tmp_path) -> None:
    path = tmp_path / "h.sqlite"
    _older_history(path, 2)
    history = JobHistory(path)
    (old,) = list(history)
    assert old.completed and old.declared_samples is None
    history.record(FinishedJob.from_snapshot(_snapshot("old", 8_000, 210.0), exit_code=0, finished_at=1100.0,
                                             declared_samples=20_000))
    assert [(job.samples, job.declared_samples) for job in history] == [(7800, None), (8_000, 20_000)]
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == 3


def test_oldest_records_are_dropped_beyond_the_bound(tmp_path, mlp_features) -> None:
    history = JobHistory(tmp_path / "h.sqlite", max_records=3)
    for i in range(5):
        history.record(FinishedJob.from_snapshot(_snapshot("j", 100 + i, 10.0), features=mlp_features,
                                                 finished_at=2000.0 + i))
    assert [job.samples for job in history] == [102, 103, 104]


def test_a_corrupt_file_is_moved_aside_and_replaced(tmp_path) -> None:
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"this is not an sqlite database" * 100)
    history = JobHistory(path)
    assert len(history) == 0
    assert list(tmp_path.glob("history.sqlite.corrupt-*"))


def test_recurring_job_gets_its_measured_throughput(tmp_path, mlp_features) -> None:
    history = JobHistory(tmp_path / "h.sqlite")
    for measured in (410.0, 400.0, 390.0):
        history.record(FinishedJob.from_snapshot(_snapshot("mlp", 1000, measured), features=mlp_features,
                                                 device="cpu", finished_at=1500.0))
    assert predicted_max_throughput(mlp_features, 1, "cpu", history) == (400.0, 390.0, 410.0)


def test_node_history_corrects_the_model(tmp_path, mlp_features, encoder_features) -> None:
    """A node whose jobs all run at half the modelled speed learns it after a few jobs."""
    history = JobHistory(tmp_path / "h.sqlite")
    model_mlp = predict(mlp_features, gpus=1, device="cpu").samples_per_s
    model_encoder = predict(encoder_features, gpus=1, device="cpu").samples_per_s
    predictor = ThroughputPredictor(device="cpu", history=history)
    uncorrected = predictor(encoder_features, 1)
    assert uncorrected is not None and uncorrected[0] == pytest.approx(model_encoder)
    for i, scale in enumerate((0.5, 0.45, 0.55)):
        features = dict(mlp_features, batch_size=mlp_features["batch_size"] + i)  # three different jobs
        model = predict(features, gpus=1, device="cpu").samples_per_s
        history.record(FinishedJob.from_snapshot(_snapshot(f"job{i}", 1000, model * scale), features=features,
                                                 device="cpu", finished_at=1200.0))
    assert sorted(history_ratios(history, "cpu")) == pytest.approx([0.45, 0.5, 0.55], rel=1e-6)
    corrected = predictor(encoder_features, 1)
    assert corrected is not None
    assert corrected[0] == pytest.approx(0.5 * model_encoder, rel=1e-6)
    assert corrected[1] <= corrected[0] <= corrected[2]
    assert model_mlp > 0


def test_no_features_or_unknown_device_means_no_prediction(tmp_path, mlp_features) -> None:
    assert predicted_max_throughput(None, 1, "cpu") is None
    assert predicted_max_throughput({}, 1, "cpu") is None
    assert predicted_max_throughput(mlp_features, 1, "TPUv9") is None


def test_a_job_the_model_cannot_predict_is_warned_about_once_however_often_it_is_asked(caplog) -> None:
    predictor = ThroughputPredictor(device="cpu")
    no_work = {"params": 1000.0}  # parameter sizes only: no batch size, no counted ops
    with caplog.at_level(logging.WARNING, logger="controller.prediction"):
        assert [predictor(no_work, 1) for _ in range(5)] == [None] * 5
    warnings = [r.getMessage() for r in caplog.records if "no throughput prediction" in r.getMessage()]
    assert len(warnings) == 1 and "describe no work" in warnings[0], warnings

