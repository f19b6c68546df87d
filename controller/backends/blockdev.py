"""Which block device a dataset is read from, as the "MAJ:MIN" that read throttles name.

blkio.throttle.read_bps_device and io.max take a whole disk, not a partition, so a
path on /dev/vda1 must be throttled as /dev/vda. Filesystems without a device of
their own (btrfs subvolumes, overlay) get one from the mount table when it names a
block device.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from controller.backends.base import BackendError


def read_device_of(path: Path, proc: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> str:
    """"MAJ:MIN" of the whole disk holding ``path``. Raises BackendError if no block device holds it."""
    try:
        dev = os.stat(path).st_dev
    except OSError as exc:
        raise BackendError(f"cannot stat {path} to find its disk: {exc.strerror}; pass an existing dataset path") from exc
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:
        major, minor = _device_from_mount_table(path, f"{major}:{minor}", proc)
    return whole_disk_of(f"{major}:{minor}", sys_root)


def _device_from_mount_table(path: Path, anonymous: str, proc: Path) -> tuple[int, int]:
    """For a filesystem with an anonymous st_dev (0:N): the block device its mount names as source."""
    mountinfo = proc / "self" / "mountinfo"
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError as exc:
        raise BackendError(f"cannot read {mountinfo} to find the disk of {path}: {exc.strerror}") from exc
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or fields[2] != anonymous or " - " not in line:
            continue
        source = line.split(" - ", 1)[1].split()[1]
        try:
            st = os.stat(source)
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode):
            return os.major(st.st_rdev), os.minor(st.st_rdev)
    raise BackendError(
        f"{path} is not on a block device (device {anonymous}: tmpfs, overlay or a network filesystem); "
        "read bandwidth cannot be throttled there: pass --read-device MAJ:MIN of the disk, or leave it unmanaged"
    )


def whole_disk_of(device: str, sys_root: Path = Path("/sys")) -> str:
    """The disk a partition belongs to (/sys/dev/block/MAJ:MIN/partition marks a partition)."""
    node = sys_root / "dev" / "block" / device
    if not (node / "partition").exists():
        return device
    try:
        return (node.resolve().parent / "dev").read_text().strip()
    except OSError as exc:
        raise BackendError(f"cannot read the parent disk of partition {device} under {node}: {exc.strerror}") from exc
