"""Peer credentials from the kernel, and which job's cgroup holds a pid (a /proc fixture tree
stands in for /proc only where the layout under test, nested groups, cannot be made here)."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from controller.peer import cgroup_paths, in_job_group, peer_belongs_to_job, peer_credentials

V1_NESTED = """9:name=systemd:/
7:blkio:/adloader/j1
3:cpuset:/adloader/j1
2:cpuacct:/adloader/j1/ranks/rank0
1:cpu:/adloader/j1/ranks/rank0
0::/
"""
V2 = "0::/kubepods/pod7/adloader/j2/sub\n"
OTHER = """1:cpu:/adloader/j10
2:cpuacct:/adloader-test/j1
3:cpuset:/j1/adloader
"""


def _proc(tmp_path: Path) -> Path:
    for pid, text in ((101, V1_NESTED), (102, V2), (103, OTHER)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


def test_credentials_are_the_connecting_process_as_the_kernel_saw_it() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        peer = peer_credentials(left)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.geteuid(), os.getegid())
    assert peer.is_root == (os.geteuid() == 0)


def test_a_pid_in_the_jobs_group_or_below_it_belongs_to_the_job(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    assert in_job_group(101, "adloader", "j1", proc)
    assert in_job_group(102, "adloader", "j2", proc)  # cgroup v2, the group itself nested in a pod
    assert not in_job_group(102, "adloader", "j1", proc)
    assert not in_job_group(103, "adloader", "j1", proc)  # j10, another group name, reversed order
    assert not in_job_group(999, "adloader", "j1", proc)  # gone
    assert cgroup_paths(102, proc) == ["/kubepods/pod7/adloader/j2/sub"]


def test_the_backends_pid_list_or_the_cgroup_path_admits_a_peer(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    listed = {"j1": {555}}.get
    assert peer_belongs_to_job(555, "j1", "adloader", lambda job: listed(job) or set(), proc)
    assert peer_belongs_to_job(101, "j1", "adloader", lambda job: set(), proc)
    assert not peer_belongs_to_job(103, "j1", "adloader", lambda job: set(), proc)
    assert not peer_belongs_to_job(0, "j1", "adloader", lambda job: {0}, proc)


def test_this_process_is_read_from_the_real_proc() -> None:
    paths = cgroup_paths(os.getpid())
    assert paths and all(path.startswith("/") for path in paths)
