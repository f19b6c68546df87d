"""Backend detection on this machine and on fixture trees, and the disk behind a dataset path."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from controller.backends import AffinityBackend, BackendError, CgroupV1Backend, CgroupV2Backend, detect_backend
from controller.backends.blockdev import read_device_of, whole_disk_of
from fixtures.cgroup2_tree import make_cgroup2_tree
from fixtures.processes import run_forked_as_nobody

CGROUP_ROOT = Path("/sys/fs/cgroup")
v1_root = pytest.mark.skipif(
    os.geteuid() != 0 or not (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists(),
    reason="needs root and the cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu",
)


@v1_root
def test_auto_picks_cgroup_v1_on_this_machine() -> None:
    assert isinstance(detect_backend(), CgroupV1Backend)


def test_auto_picks_cgroup_v2_where_the_root_offers_cpu(tmp_path: Path) -> None:
    root = make_cgroup2_tree(tmp_path / "cgroup", "adloader", [])
    assert isinstance(detect_backend(root=root), CgroupV2Backend)


def test_auto_falls_back_to_affinity_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="controller.backends.detect"):
        backend = detect_backend(root=tmp_path)
    assert isinstance(backend, AffinityBackend)
    assert "NOT enforced" in caplog.text and "as root" in caplog.text


@v1_root
def test_auto_as_an_unprivileged_user_is_affinity() -> None:
    assert run_forked_as_nobody(lambda: detect_backend().name) == "affinity"


@v1_root
def test_a_named_backend_that_cannot_work_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="cgroup-v2 cannot work here: .* not a cgroup2 mount"):
        detect_backend("cgroup-v2")
    with pytest.raises(BackendError, match="cgroup-v1 cannot work here: .*cpu.cfs_quota_us is missing"):
        detect_backend("cgroup-v1", root=tmp_path)
    with pytest.raises(BackendError, match="unknown backend 'cgroupv1'"):
        detect_backend("cgroupv1")
    assert isinstance(detect_backend("affinity"), AffinityBackend)
    unified = CGROUP_ROOT / "unified"
    if (unified / "cgroup.controllers").exists() and "cpu" not in (unified / "cgroup.controllers").read_text():
        with pytest.raises(BackendError, match="cpu controller is not in"):
            detect_backend("cgroup-v2", root=unified)


def test_read_device_of_a_path_on_a_disk_is_that_disk(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    if os.major(dev) == 0:
        pytest.skip(f"{tmp_path} is on a filesystem without a block device")
    device = read_device_of(tmp_path)
    assert device == whole_disk_of(f"{os.major(dev)}:{os.minor(dev)}")
    assert Path(f"/sys/dev/block/{device}").exists()


def test_a_partition_maps_to_its_whole_disk(tmp_path: Path) -> None:
    disk = tmp_path / "devices" / "vda"
    (disk / "vda1").mkdir(parents=True)
    (disk / "dev").write_text("254:0\n")
    (disk / "vda1" / "partition").write_text("1\n")
    (tmp_path / "dev" / "block").mkdir(parents=True)
    (tmp_path / "dev" / "block" / "254:1").symlink_to(disk / "vda1")
    (tmp_path / "dev" / "block" / "254:0").symlink_to(disk)
    assert whole_disk_of("254:1", sys_root=tmp_path) == "254:0"
    assert whole_disk_of("254:0", sys_root=tmp_path) == "254:0"


def test_a_path_without_a_disk_is_refused_with_a_remedy() -> None:
    if os.major(os.stat("/proc").st_dev) != 0:
        pytest.skip("/proc has a block device here?")
    with pytest.raises(BackendError, match="not on a block device.*--read-device"):
        read_device_of(Path("/proc"))
