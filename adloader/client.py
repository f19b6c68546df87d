"""A small blocking client for the controller socket: one persistent connection, one
request, one reply line. Used by the launcher, ``adloader status`` and the loader's
reporter thread."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Sequence

from adloader import protocol
from adloader.errors import ControllerRefused, ControllerUnavailable, ProtocolError


class ControllerClient:
    """Connects lazily; any socket failure closes the connection and raises
    :class:`ControllerUnavailable`, so the caller can retry later with a fresh one."""

    def __init__(self, path: str | Path, timeout: float = 5.0) -> None:
        self.path = str(path)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""

    def connect(self) -> None:
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise ControllerUnavailable(f"no controller at {self.path}: {exc.strerror or exc}") from None
        self._sock = sock
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, message: protocol.Message) -> protocol.Message:
        """Send one message, return the reply. An Error reply raises ControllerRefused."""
        reply = self.request_raw(protocol.encode(message))
        if isinstance(reply, protocol.Error):
            raise ControllerRefused(reply.code, reply.message)
        return reply

    def request_raw(self, line: bytes) -> protocol.Message:
        """Send raw bytes (tests send malformed ones) and return the decoded reply, Error included."""
        self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(line)
            reply = self._read_line()
        except (OSError, ProtocolError) as exc:
            self.close()
            raise ControllerUnavailable(f"connection to {self.path} lost: {exc}") from None
        return reply

    def _read_line(self) -> protocol.Message:
        assert self._sock is not None
        while b"\n" not in self._buffer:
            if len(self._buffer) > protocol.MAX_LINE_BYTES:
                raise ProtocolError("too_long", "reply exceeds the line bound")
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("controller closed the connection")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return protocol.decode(line)


def connect_first(candidates: Sequence[str | Path], timeout: float = 5.0) -> ControllerClient:
    """A client connected to the first of ``candidates`` where a controller listens (the
    order of :func:`adloader.paths.client_socket_paths`). Raises ControllerUnavailable
    naming every path tried and why each failed."""
    failures = []
    for path in candidates:
        client = ControllerClient(path, timeout=timeout)
        try:
            client.connect()
        except ControllerUnavailable as exc:
            failures.append(str(exc).removeprefix("no controller at "))
            continue
        return client
    raise ControllerUnavailable("no controller at " + ", nor at ".join(failures))
