"""Where the controller's socket lives. One rule, used by every side of the socket."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from adloader import env

ROOT_SOCKET = Path("/run/adloader/adloader.sock")


def default_socket_path(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """``ADLOADER_SOCKET`` if set; else ``/run/adloader/adloader.sock`` for root; else
    ``$XDG_RUNTIME_DIR/adloader/adloader.sock``, or ``/tmp/adloader-<uid>/adloader.sock``
    when XDG_RUNTIME_DIR is unset."""
    environ = environ if environ is not None else os.environ
    override = env.socket_override(environ)
    if override:
        return Path(override)
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return ROOT_SOCKET
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "adloader" / "adloader.sock"
    return Path(f"/tmp/adloader-{uid}") / "adloader.sock"


def default_state_dir(uid: int | None = None) -> Path:
    """``/var/lib/adloader`` for root, ``~/.local/state/adloader`` otherwise."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return Path("/var/lib/adloader")
    return Path.home() / ".local" / "state" / "adloader"
