"""The controller's Unix socket: newline-delimited JSON, one asyncio task per connection.

Every line gets exactly one reply line; the unfinished last line of a connection that
closes mid-line is dropped unanswered (it was never sent whole). A malformed line gets
an Error reply with the code :func:`adloader.protocol.decode` gives it and changes
nothing; a line over ``MAX_LINE_BYTES`` gets a ``too_long`` Error and the connection is
closed (the rest of that line cannot be framed). One client's bad input never reaches
another's task.

The socket file is made mode 0666: anyone may connect, and the request handler
authorizes each request from the peer's kernel credentials (SO_PEERCRED), never from
the file mode or a message field.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from adloader import protocol
from adloader.errors import AdloaderError, ProtocolError
from controller.peer import PeerCredentials, peer_credentials

log = logging.getLogger(__name__)

SOCKET_MODE = 0o666
STOP_TIMEOUT_S = 5.0
"""How long a stop waits for the connections it closed to finish."""
DIRECTORY_MODE = 0o755


class SocketInUse(AdloaderError):
    """Another controller answers on the socket path, or something that is not a socket is there."""


class RequestRefused(AdloaderError):
    """A well-formed request the controller will not carry out; becomes an Error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Connection:
    """One client connection, as the request handler sees it."""

    peer: PeerCredentials
    job_id: str | None = None
    """The job this connection registered (the launcher's connection), if any."""
    verified_jobs: set[str] = field(default_factory=set)
    """Jobs this peer was found to belong to (checked once per connection)."""


Handler = Callable[[protocol.Message, Connection], protocol.Message]


def prepare_socket_path(path: Path) -> None:
    """Make the socket's directory (0755 when we create it) and clear a stale socket file.

    Raises SocketInUse if a controller answers there, or if the path is not a socket."""
    directory = path.parent
    if not directory.exists():
        directory.mkdir(parents=True, mode=DIRECTORY_MODE)
        os.chmod(directory, DIRECTORY_MODE)  # mkdir's mode is filtered by the umask
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket: remove it or pass another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale socket %s (nothing listens on it)", path)
        path.unlink(missing_ok=True)
        return
    except OSError as exc:
        raise SocketInUse(f"cannot probe existing socket {path}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise SocketInUse(
        f"another controller is already listening on {path}: stop it first, or give this one "
        "another --socket (and --cgroup-group)"
    )


class ControlServer:
    """Serves ``handle`` on a Unix socket. ``on_close`` runs when a connection ends;
    ``on_error`` is told the code of every Error reply sent (for the error counters)."""

    def __init__(
        self,
        path: Path,
        handle: Handler,
        on_close: Callable[[Connection], None] = lambda c: None,
        on_error: Callable[[str], None] = lambda code: None,
    ) -> None:
        self.path = Path(path)
        self._handle = handle
        self._on_close = on_close
        self._on_error = on_error
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._inode: int | None = None

    @property
    def clients(self) -> int:
        return len(self._writers)

    async def start(self) -> None:
        prepare_socket_path(self.path)
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=protocol.MAX_LINE_BYTES + 1
        )
        os.chmod(self.path, SOCKET_MODE)
        self._inode = self.path.stat().st_ino
        log.info("listening on %s", self.path)

    async def stop(self) -> None:
        """Stop accepting, close every connection and let its task finish, and remove the socket
        file if it is still ours. A connection task left pending would be cancelled when the loop
        closes, and asyncio logs a cancelled connection task as an error with a traceback."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            if self._tasks:
                _, stuck = await asyncio.wait(set(self._tasks), timeout=STOP_TIMEOUT_S)
                if stuck:  # a handler that never returns (a bug): do not hang the stop on it
                    log.warning("%d connection(s) did not close within %g s; stopping anyway", len(stuck),
                                STOP_TIMEOUT_S)
            await self._server.wait_closed()
            self._server = None
        try:
            if self._inode is not None and self.path.stat().st_ino == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            connection = Connection(peer=peer_credentials(writer.get_extra_info("socket")))
        except OSError as exc:
            log.warning("dropping a connection whose credentials cannot be read: %s", exc)
            writer.close()
            return
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await self._converse(reader, writer, connection)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            try:
                self._on_close(connection)
            except Exception:
                log.exception("cleaning up after a closed connection failed")
            writer.close()

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: Connection
    ) -> None:
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # asyncio's LimitOverrunError: no newline within the limit
                await self._send(writer, self._error("too_long", f"line exceeds {protocol.MAX_LINE_BYTES} bytes; "
                                                     "closing the connection"))
                return
            if not line.endswith(b"\n"):  # closed, perhaps mid-line: an unfinished line is never acted on
                if line:
                    log.debug("pid %d closed the connection in the middle of a line (%d bytes): dropped",
                              connection.peer.pid, len(line))
                return
            await self._send(writer, self._reply(line.rstrip(b"\r\n"), connection))

    def _reply(self, line: bytes, connection: Connection) -> protocol.Message:
        try:
            message = protocol.decode(line)
        except ProtocolError as exc:
            log.debug("pid %d sent a malformed line: %s", connection.peer.pid, exc.message)
            return self._error(exc.code, exc.message)
        try:
            return self._handle(message, connection)
        except RequestRefused as exc:
            log.debug("refused %s from pid %d: %s", message.TYPE, connection.peer.pid, exc.message)
            return self._error(exc.code, exc.message)
        except Exception as exc:  # a bug in one request must not take the daemon down
            log.exception("internal error handling %s from pid %d", message.TYPE, connection.peer.pid)
            return self._error("internal", f"the controller failed on this request ({type(exc).__name__}); "
                               "see its log")

    def _error(self, code: str, message: str) -> protocol.Error:
        self._on_error(code)
        return protocol.Error(code=code, message=message)

    async def _send(self, writer: asyncio.StreamWriter, reply: protocol.Message) -> None:
        try:
            data = protocol.encode(reply)
        except ProtocolError as exc:
            data = protocol.encode(self._error(exc.code, f"the reply is too large to send: {exc.message}"))
        writer.write(data)
        await writer.drain()
