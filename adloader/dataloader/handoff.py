"""Giving one spawn/forkserver worker its own pickled copy of the dataset, as ``Process.start`` would.

torch pickles the dataset once per worker, inside ``Process.start()``. That
matters for two kinds of objects:
  * tensors: their shared memory travels as a file descriptor that the
    receiver takes over while unpickling. One pickle, one descriptor: if two
    workers unpickled the same bytes, only the first would get it.
  * ``multiprocessing`` locks, semaphores and shared ``Value``/``Array``:
    they refuse to be pickled except while a process is being started
    ("should only be shared between processes through inheritance").

So for each worker the dataset (with collate_fn and worker_init_fn) is
pickled here with multiprocessing's *spawning popen* set to a collector, the
hook ``Process.start`` itself uses: every descriptor the pickle needs is
collected instead of being handed to a one-shot ``resource_sharer`` server,
and locks see a process start. The bytes and the descriptors go down the
worker's own connection (descriptors as SCM_RIGHTS), and the worker unpickles
with those descriptors standing in for the ones ``Process.start`` would have
passed. Workers under ``fork`` inherit the dataset and never come here.
"""
from __future__ import annotations

import socket
import struct
from multiprocessing import context as mp_context
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

_MAX_FDS_PER_MESSAGE = 250  # the kernel's SCM_MAX_FD is 253
_HEADER = struct.Struct("!I")

_received_fds: list[int] = []  # in a worker: the descriptors its pickle refers to, by index


class _PassedFd:
    """Stands for a descriptor in a worker's pickle; ``detach()`` is what multiprocessing's and torch's
    rebuild functions call to take the descriptor over."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return _received_fds[self.index]


class _DescriptorCollector:
    """Plays the *spawning popen* of ``multiprocessing.context`` while one worker's pickle is made."""

    DupFd = _PassedFd

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1


class WorkerPickle(NamedTuple):
    """One worker's pickle and the descriptors it refers to (open until :func:`send` has sent them)."""

    data: bytes
    fds: list[int]


def pickle_for_one_worker(obj: Any) -> WorkerPickle:
    """Pickle ``obj`` as ``Process.start`` would for one child."""
    collector = _DescriptorCollector()
    previous = mp_context.get_spawning_popen()
    mp_context.set_spawning_popen(collector)
    try:
        data = bytes(ForkingPickler.dumps(obj))
    finally:
        mp_context.set_spawning_popen(previous)
    return WorkerPickle(data, collector.fds)


def send(conn: Connection, pickled: WorkerPickle) -> None:
    """Send one worker its pickle: a header with the descriptor count, the descriptors, then the bytes."""
    fds = pickled.fds
    sock = socket.socket(fileno=conn.fileno())  # shares conn's descriptor; detached below, never closed
    try:
        sock.sendall(_HEADER.pack(len(fds)))
        for start in range(0, len(fds), _MAX_FDS_PER_MESSAGE):
            socket.send_fds(sock, [b"F"], fds[start:start + _MAX_FDS_PER_MESSAGE])
    finally:
        sock.detach()
    conn.send_bytes(pickled.data)


def receive(conn: Connection) -> Any:
    """In the worker: read what :func:`send` sent and unpickle it with the passed descriptors."""
    sock = socket.socket(fileno=conn.fileno())
    try:
        header = b""
        while len(header) < _HEADER.size:
            chunk = sock.recv(_HEADER.size - len(header))
            if not chunk:
                raise EOFError("the training process closed the connection before sending the dataset")
            header += chunk
        (count,) = _HEADER.unpack(header)
        fds: list[int] = []
        while len(fds) < count:
            marker, more, _, _ = socket.recv_fds(sock, 1, _MAX_FDS_PER_MESSAGE)
            if not marker:
                raise EOFError("the training process closed the connection while sending the dataset")
            fds += more
    finally:
        sock.detach()
    _received_fds[:] = fds
    return ForkingPickler.loads(conn.recv_bytes())
