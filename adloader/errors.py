"""Typed errors shared by every adloader package. Each message says what went wrong and what to do."""
from __future__ import annotations


class AdloaderError(Exception):
    """Base class of every error adloader raises on purpose."""


class ProtocolError(AdloaderError):
    """A message on the controller socket was malformed; ``code`` is sent back in the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ControllerUnavailable(AdloaderError):
    """No controller answers on the socket. Normal on a node without one: run unmanaged."""


class ControllerRefused(AdloaderError):
    """The controller answered with an error reply (``code`` and ``message`` come from it)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"controller refused the request ({code}): {message}")
        self.code = code
        self.message = message
