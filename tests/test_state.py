"""The controller's state file: round trip, every way it can be damaged, crashes mid-write, full/read-only disks."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path
from typing import Iterator

import pytest

from controller import faults
from controller.policies.base import JobAllocation
from controller.state import (
    STATE_VERSION,
    ControllerState,
    LearntModel,
    PersistedJob,
    StateStore,
    StateWriteError,
)
from fixtures.processes import run_forked_as_nobody

REPO = Path(__file__).resolve().parents[1]
NOW = 1_700_000_000.0


def make_state(policy: str = "adaptive", jobs: int = 2) -> ControllerState:
    return ControllerState(
        version=STATE_VERSION,
        policy=policy,
        jobs={
            f"job-{i}": PersistedJob(
                job_id=f"job-{i}",
                name=f"resnet-{i}",
                uid=1000 + i,
                gpus=i + 1,
                launcher_pid=4000 + i,
                registered_at=NOW - 60 * i,
                cgroup=f"/sys/fs/cgroup/cpu/adloader/job-{i}",
                wanted=JobAllocation(cores=1.5, cpus=(0, 1), read_bps=5_000_000, workers=3)
                if i % 2 == 0
                else JobAllocation(),
                applied=JobAllocation(cores=1.5, cpus=(0, 1), read_bps=4_000_000, workers=3)
                if i % 2 == 0
                else JobAllocation(),
                requested_workers=8 if i % 2 == 0 else None,
                features={"flops": 1.2e12, "params": 2.5e7} if i % 2 == 0 else None,
                remaining_samples=1e6 if i % 2 == 0 else None,
            )
            for i in range(jobs)
        },
        saved_at=0.0,
    )


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(tmp_path / "state", clock=lambda: NOW)


def test_round_trip(store: StateStore) -> None:
    saved = store.save(make_state())
    assert saved.saved_at == NOW
    loaded = store.load()
    assert loaded.problem is None
    assert loaded.state == saved
    assert loaded.state.jobs["job-0"].wanted.cpus == (0, 1)


def test_a_float_read_rate_from_a_policy_survives_a_round_trip(store: StateStore) -> None:
    state = make_state(jobs=1)
    job = state.jobs["job-0"]
    floaty = replace(job, wanted=replace(job.wanted, read_bps=2_500_000.0))
    store.save(replace(state, jobs={"job-0": floaty}))
    assert store.load().state.jobs["job-0"].wanted.read_bps == 2_500_000


def test_every_allocation_and_model_field_survives_a_round_trip(store: StateStore) -> None:
    """Each field of JobAllocation and LearntModel set to a value unlike its default: a field
    the typed decoder forgot (as cpu_weight once was) fails here."""
    everything = JobAllocation(cores=0.75, cpu_weight=321, cpus=(1, 3), read_bps=7_000_000, workers=5)
    assert all(getattr(everything, f.name) != f.default for f in fields(JobAllocation))
    model = LearntModel(max_throughput=412.5, cpu_s_per_sample=0.0031, bytes_per_sample=110_000.0,
                        loading_observations=((0.5, 160.0), (0.75, 241.5)))
    assert all(getattr(model, f.name) != f.default for f in fields(LearntModel))
    state = make_state(jobs=1)
    job = replace(state.jobs["job-0"], wanted=everything, applied=replace(everything, cpu_weight=123), model=model)
    saved = store.save(replace(state, jobs={"job-0": job}))
    assert store.load().state == saved
    loaded = store.load().state.jobs["job-0"]
    assert (loaded.wanted, loaded.applied.cpu_weight, loaded.model) == (everything, 123, model)


def test_a_version_1_file_is_read_with_its_allocation_as_wanted_and_applied(store: StateStore) -> None:
    store.save(make_state(jobs=1))

    def downgrade(document: dict) -> None:
        job = document["payload"]["jobs"]["job-0"]
        job["allocation"] = job.pop("wanted")
        del job["applied"], job["model"]
        document["version"] = document["payload"]["version"] = 1
        document["checksum"] = _checksum(document["payload"])

    _rewrite(store, downgrade)
    loaded = store.load()
    assert loaded.problem is None
    job = loaded.state.jobs["job-0"]
    assert job.wanted == job.applied == JobAllocation(cores=1.5, cpus=(0, 1), read_bps=5_000_000, workers=3)
    assert job.model == LearntModel()


def test_missing_file_is_no_state_and_no_problem(store: StateStore) -> None:
    result = store.load()
    assert result.state is None and result.problem is None


def corrupt_files(store: StateStore) -> list[Path]:
    return sorted(store.directory.glob("state.json.corrupt-*"))


def test_every_truncation_is_reported_and_moved_aside(store: StateStore) -> None:
    store.save(make_state(jobs=1))
    raw = store.path.read_bytes()
    for length in range(len(raw.rstrip())):  # cutting only the final newline leaves the whole document
        store.path.write_bytes(raw[:length])
        result = store.load()
        assert result.state is None and result.problem, f"truncated to {length} bytes was accepted"
        assert not store.path.exists()
        [aside] = corrupt_files(store)
        assert aside.read_bytes() == raw[:length]
        aside.unlink()
    store.path.write_bytes(raw)
    assert store.load().state is not None


def _rewrite(store: StateStore, edit) -> None:  # type: ignore[no-untyped-def]
    document = json.loads(store.path.read_text())
    edit(document)
    store.path.write_text(json.dumps(document))


def _checksum(payload: dict) -> str:
    """The file format's checksum: sha256 of the payload as compact JSON with sorted keys."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_a_changed_value_fails_the_checksum(store: StateStore) -> None:
    store.save(make_state())
    _rewrite(store, lambda d: d["payload"]["jobs"]["job-0"]["wanted"].update(cores=15.0))
    result = store.load()
    assert result.state is None and "checksum mismatch" in result.problem
    assert "moved aside to" in result.problem and len(corrupt_files(store)) == 1


def test_a_newer_version_is_refused(store: StateStore) -> None:
    store.save(make_state())
    _rewrite(store, lambda d: d.update(version=STATE_VERSION + 1))
    result = store.load()
    assert result.state is None and "newer adloader" in result.problem


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda p: p["jobs"]["job-0"].pop("uid"), "jobs.job-0: required field 'uid' is missing"),
        (lambda p: p["jobs"]["job-0"].update(gpus="two"), "jobs.job-0.gpus must be an integer, got str"),
        (lambda p: p["jobs"]["job-0"]["applied"].update(cpus=[0, "x"]), "applied.cpus[] must be an integer, got str"),
        (lambda p: p["jobs"]["job-0"]["wanted"].update(cpus=[0, -1]), "wanted.cpus holds a negative CPU id"),
        (lambda p: p["jobs"]["job-0"].update(features={"flops": "big"}), "features.flops must be a number, got str"),
        (lambda p: p["jobs"]["job-0"]["model"].update(loading_observations=[[1.0]]), "must hold 2 items, got 1"),
        (lambda p: p.update(jobs=[]), "payload.jobs must be an object, got list"),
        (lambda p: p["jobs"]["job-0"].update(job_id="job-9"), "jobs.job-0 holds job 'job-9'"),
    ],
)
def test_a_wrong_shape_with_a_valid_checksum_is_refused(store: StateStore, edit, expected: str) -> None:  # type: ignore[no-untyped-def]
    store.save(make_state())

    def edit_and_reseal(document: dict) -> None:
        edit(document["payload"])
        document["checksum"] = _checksum(document["payload"])

    _rewrite(store, edit_and_reseal)
    result = store.load()
    assert result.state is None and expected in result.problem


def test_not_a_state_file_is_refused(store: StateStore) -> None:
    store.directory.mkdir(parents=True)
    store.path.write_text('{"hello": "world"}')
    assert "not an adloader state file" in store.load().problem


def test_a_leftover_temp_file_is_removed_and_the_last_state_kept(store: StateStore) -> None:
    saved = store.save(make_state())
    (store.directory / "state.json.tmp").write_text('{"half a new st')
    assert store.load().state == saved
    assert not (store.directory / "state.json.tmp").exists()


def test_a_crash_between_temp_write_and_rename_keeps_the_old_state(store: StateStore) -> None:
    old = store.save(make_state(policy="even"))
    script = (
        "import sys; from pathlib import Path\n"
        "from controller.state import StateStore\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from test_state import make_state\n"
        f"StateStore(Path({str(store.directory)!r})).save(make_state(policy='adaptive', jobs=3))\n"
        "print('not reached')\n"
    )
    env = dict(os.environ, ADLOADER_FAULT_POINT="state.after_temp_write")
    crashed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert crashed.returncode == 137, crashed.stderr
    assert "fault point state.after_temp_write hit" in crashed.stderr and "not reached" not in crashed.stdout
    assert (store.directory / "state.json.tmp").exists()
    result = store.load()
    assert result.problem is None and result.state == old
    assert not (store.directory / "state.json.tmp").exists()


def test_a_configured_fault_point_only_fires_at_its_own_name(store: StateStore) -> None:
    faults.configure("some.other.point")
    try:
        assert store.save(make_state()).policy == "adaptive"
    finally:
        faults.configure(None)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up (needs root): {mounted.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_a_full_disk_is_a_state_write_error_and_the_old_file_survives(tiny_tmpfs: Path) -> None:
    store = StateStore(tiny_tmpfs / "state", clock=lambda: NOW)
    old = store.save(make_state(jobs=1))
    with open(tiny_tmpfs / "filler", "wb", buffering=0) as filler:
        with pytest.raises(OSError, match="No space left"):
            while True:
                filler.write(b"\0" * 4096)
    with pytest.raises(StateWriteError, match=r"No space left on device.*free space on that filesystem"):
        store.save(make_state(jobs=40))
    assert store.load().state == old
    assert not (store.directory / "state.json.tmp").exists()


def test_a_read_only_directory_is_a_state_write_error(tiny_tmpfs: Path) -> None:
    store = StateStore(tiny_tmpfs / "state", clock=lambda: NOW)
    store.directory.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    with pytest.raises(StateWriteError, match=rf"{store.directory}.*Read-only file system.*writable"):
        store.save(make_state())


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody for the test needs root")
def test_a_directory_the_user_cannot_write_is_a_state_write_error() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as root_owned:  # 0700 pytest dirs would fail on traversal
        Path(root_owned).chmod(0o755)

        def save_as_nobody() -> str:
            try:
                StateStore(Path(root_owned)).save(make_state())
            except StateWriteError as exc:
                return str(exc)
            return "saved"

        message = run_forked_as_nobody(save_as_nobody)
    assert f"{root_owned}/state.json" in message and "Permission denied" in message
