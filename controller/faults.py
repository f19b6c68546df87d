"""Named crash points for crash tests: die right there, as a power cut or SIGKILL would.

Code marks a point with ``faults.hit("state.after_temp_write")``. When the
environment variable ADLOADER_FAULT_POINT names that point, the process writes
one line to stderr and ends at once with exit status 137 (no cleanup, no
flush), so a test can check what a crash at that instant leaves behind.
Otherwise a hit costs one string comparison (the variable is read once, at the
first hit; ``configure`` overrides it in-process). Points are named
``<area>.<moment>``, e.g. ``state.after_temp_write`` (the new state is in the
temp file, not yet renamed); ``grep -rn 'faults.hit(' controller`` lists them all.
"""
from __future__ import annotations

import os

ENV_VAR = "ADLOADER_FAULT_POINT"
EXIT_STATUS = 137

_UNREAD = object()
_armed: object | str | None = _UNREAD


def configure(point: str | None) -> None:
    """Arm ``point`` (None disarms), overriding the environment; for tests in this process."""
    global _armed
    _armed = point


def hit(point: str) -> None:
    """End the process now (status 137) if ``point`` is the armed fault point."""
    global _armed
    if _armed is _UNREAD:
        _armed = os.environ.get(ENV_VAR) or None
    if _armed == point:
        os.write(2, f"adloader: fault point {point} hit ({ENV_VAR}), exiting {EXIT_STATUS}\n".encode())
        os._exit(EXIT_STATUS)
