"""Where the controller's socket, state and locks live. One rule, used by every side of the socket.

One node, one socket: a controller started by root (the systemd service) serves
``/run/adloader/adloader.sock``, and every user's ``adloader run``, ``adloader status``
and loader look there first. A user who runs a controller of their own (no root: the
affinity backend) serves a per-user socket, ``$XDG_RUNTIME_DIR/adloader/adloader.sock``
or ``/tmp/adloader-<uid>/adloader.sock``, which that user's clients try second.
``ADLOADER_SOCKET`` replaces the whole search with one path.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from adloader import env

SYSTEM_SOCKET = Path("/run/adloader/adloader.sock")
SYSTEM_STATE_DIR = Path("/var/lib/adloader")


def user_socket_path(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """The per-user socket: ``$XDG_RUNTIME_DIR/adloader/adloader.sock``, or
    ``/tmp/adloader-<uid>/adloader.sock`` when XDG_RUNTIME_DIR is unset."""
    environ = environ if environ is not None else os.environ
    uid = os.geteuid() if uid is None else uid
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "adloader" / "adloader.sock"
    return Path(f"/tmp/adloader-{uid}") / "adloader.sock"


def default_socket_path(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """Where a controller serves by default: ``ADLOADER_SOCKET`` if set; else the system
    socket for root; else the per-user socket."""
    environ = environ if environ is not None else os.environ
    override = env.socket_override(environ)
    if override:
        return Path(override)
    uid = os.geteuid() if uid is None else uid
    return SYSTEM_SOCKET if uid == 0 else user_socket_path(environ, uid)


def client_socket_paths(
    environ: Mapping[str, str] | None = None, uid: int | None = None, system_socket: Path = SYSTEM_SOCKET,
) -> tuple[Path, ...]:
    """Where a client looks for a controller, in order: ``ADLOADER_SOCKET`` alone if set;
    else the system socket, then (for a user other than root) the per-user socket."""
    environ = environ if environ is not None else os.environ
    override = env.socket_override(environ)
    if override:
        return (Path(override),)
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return (system_socket,)
    return tuple(dict.fromkeys((system_socket, user_socket_path(environ, uid))))


def default_state_dir(uid: int | None = None) -> Path:
    """``/var/lib/adloader`` for root, ``~/.local/state/adloader`` otherwise."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return SYSTEM_STATE_DIR
    return Path.home() / ".local" / "state" / "adloader"


def default_lock_dir(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """Where controllers take their per-group locks: ``/run/adloader/locks`` for root, the
    per-user socket's directory otherwise. Independent of ``--socket``, so two controllers
    with different sockets still meet here."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return SYSTEM_SOCKET.parent / "locks"
    return user_socket_path(environ, uid).parent / "locks"
