"""A quiet helper process that forks loader workers on request (a "zygote").

Why: a worker added mid-epoch must not be forked from the training process,
which by then runs many threads (the dispatcher, the reporter, torch's
intra-op pool, NCCL...): a fork copies only the calling thread, and any lock
another thread held stays locked forever in the child. The helper is started
once, at ``iter()``, the same moment torch forks its own workers (so a script
that works with torch's loader works here: the dataset may live in
``__main__``, nothing is pickled with the default ``fork``). It stays
single-threaded and idle, and forks each worker from itself in milliseconds.

With ``multiprocessing_context`` spawn or forkserver the helper itself is
started that way and holds no dataset: the training process pickles the
dataset once per worker, as torch does, and sends it down that worker's
connection (handoff.py); each worker unpickles its own copy.

Control socket (SOCK_SEQPACKET, so messages keep their boundaries and carry
file descriptors), with the typed messages of messages.py:
  main -> helper: Spawn(token, identity) with the worker's end of its connection attached
  helper -> main: Hello() once it runs, Spawned(token, pid) and Exited(pid, wait status)
The helper reaps its children and reports each exit, which is how the
dispatcher learns that a worker died and how (signal, exit code). Workers die
with the helper (PR_SET_PDEATHSIG); the helper exits when the control socket
closes or its parent goes away, after stopping its workers.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

from adloader.dataloader.fetch import FetchSpec
from adloader.dataloader.messages import Exited, FromHelper, Hello, HelperNews, Spawn, Spawned, WorkerIdentity
from adloader.dataloader.worker import worker_main

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 1 << 16
_STOP_GRACE_S = 1.0

# The training-process ends of every live helper's control socket. A helper forked while another is
# alive inherits the other's end; it closes them all at once, or that other helper would never see its
# control socket close (and would be killed after a timeout instead of exiting).
_control_ends: set[int] = set()


class WorkerSpawner:
    """The training-process side of the helper: ask for workers, read what happened to them."""

    def __init__(self, context: BaseContext, spec: FetchSpec, proc_root: str = "/proc") -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        forked = context.get_start_method() == "fork"
        self._sock = ours
        inherited = sorted(_control_ends | {ours.fileno()}) if forked else []
        self.process = context.Process(
            target=_helper_main,
            args=(theirs, inherited, spec if forked else None, proc_root),
            name="adloader-spawner",
            daemon=True,
        )
        try:
            self.process.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        _control_ends.add(ours.fileno())
        self._next_token = 0
        self.started = False  # True once the helper said HELLO: it got past its own start-up

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def fileno(self) -> int:
        """Readable when the helper has news (Spawned / Exited); for multiprocessing.connection.wait."""
        return self._sock.fileno()

    @property
    def sentinel(self) -> int:
        """Readable when the helper process has exited."""
        return self.process.sentinel

    def spawn(self, identity: WorkerIdentity) -> tuple[int, Connection]:
        """Ask for one worker; returns (token, our end of its connection). The pid comes later as Spawned."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        token = self._next_token
        self._next_token += 1
        try:
            socket.send_fds(self._sock, [pickle.dumps(Spawn(token, identity))], [theirs.fileno()])
        finally:
            theirs.close()
        return token, Connection(ours.detach())

    def has_news(self) -> bool:
        """Something the helper sent waits to be read (its Hello, for one)."""
        return bool(select.select([self._sock], [], [], 0)[0])

    def read_news(self) -> list[HelperNews]:
        """Everything the helper has sent so far, without blocking. EOF (helper gone) gives []."""
        news: list[HelperNews] = []
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return news
            except OSError:
                return news
            if not data:
                return news
            message: FromHelper = pickle.loads(data)
            if isinstance(message, Hello):
                self.started = True
            else:
                news.append(message)

    def kill(self) -> None:
        """Kill the helper now (it hung) and close our end; its workers die with it."""
        self.process.kill()
        self.close(timeout=5.0)

    def close(self, timeout: float = 3.0) -> None:
        """Close the control socket; the helper stops its workers and exits. Kill it if it does not."""
        _control_ends.discard(self._sock.fileno())
        try:
            self._sock.close()
        except OSError:
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            log.warning("worker-spawning helper pid %s did not exit in %.0f s; killing it", self.process.pid, timeout)
            self.process.kill()
            self.process.join(timeout)


# ------------------------------------------------------------------ inside the helper process


def _helper_main(sock: socket.socket, inherited_ends: list[int], payload: FetchSpec | None, proc_root: str) -> None:
    for fd in inherited_ends:  # fork: the training process's ends of this and other helpers' sockets
        try:
            os.close(fd)
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through the wakeup fd
    parent = os.getppid()
    children: set[int] = set()
    _send(sock, Hello())
    while True:
        try:
            readable, _, _ = select.select([sock, wake_r], [], [], 1.0)
        except InterruptedError:
            readable = []
        if wake_r in readable:
            _drain(wake_r)
        _reap(sock, children)
        if os.getppid() != parent:
            break
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
        except OSError:
            break
        if not data:
            break  # the training process closed the control socket
        request: Spawn = pickle.loads(data)
        pid = _fork_worker(fds[0], sock, (wake_r, wake_w), payload, request.identity, proc_root)
        os.close(fds[0])
        children.add(pid)
        _send(sock, Spawned(request.token, pid))
    _stop_children(sock, children)


def _fork_worker(
    fd: int, sock: socket.socket, wake: tuple[int, int], payload: FetchSpec | None, identity: WorkerIdentity,
    proc_root: str,
) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for own in (sock.fileno(), *wake):
            os.close(own)
        _die_with_parent()
        worker_main(Connection(fd), payload, identity, proc_root)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when the helper dies (Linux), so no worker outlives it."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the worker still exits when its connection closes
    if os.getppid() != parent:  # the helper died before prctl took effect
        os._exit(1)


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(sock, Exited(pid, status))


def _stop_children(sock: socket.socket, children: set[int]) -> None:
    """Give workers (already sent STOP, or whose connection just closed) a moment, then kill the rest."""
    deadline = time.monotonic() + _STOP_GRACE_S
    while children and time.monotonic() < deadline:
        _reap(sock, children)
        time.sleep(0.001)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _send(sock: socket.socket, message: FromHelper) -> None:
    try:
        sock.send(pickle.dumps(message))
    except OSError:
        pass  # the training process is gone; nobody to tell


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def default_context() -> BaseContext:
    """torch's default: the platform's multiprocessing default (fork on Linux)."""
    return multiprocessing.get_context()
