"""Named crash points for crash tests: die right there, as a power cut or SIGKILL would.

Code marks a point with ``faults.hit("state.after_temp_write")``. When the
environment variable ADLOADER_FAULT_POINT names that point, the process writes
one line to stderr and ends at once with exit status 137 (no cleanup, no
flush), so a test can check what a crash at that instant leaves behind.
Otherwise a hit costs one string comparison (the variable is read once, at the
first hit; ``configure`` overrides it in-process). ``NAME@N`` dies at the N-th hit
of that point instead of the first, so a crash test can let a restarted process get
past its own recovery (which hits most points once) and die mid-run. Points are named
``<area>.<moment>``, e.g. ``state.after_temp_write`` (the new state is in the
temp file, not yet renamed); ``grep -rn 'faults.hit(' controller`` lists them all.
"""
from __future__ import annotations

import os

ENV_VAR = "ADLOADER_FAULT_POINT"
EXIT_STATUS = 137

_UNREAD = object()
_armed: object | str | None = _UNREAD
_hits_left = 1


def configure(point: str | None) -> None:
    """Arm ``point`` (``NAME`` or ``NAME@N``; None disarms), overriding the environment; for tests
    in this process."""
    global _armed, _hits_left
    _armed, _hits_left = _parse(point)


def _parse(spec: str | None) -> tuple[str | None, int]:
    name, _, count = (spec or "").partition("@")
    return name or None, int(count) if count.isdigit() and int(count) > 0 else 1


def hit(point: str) -> None:
    """End the process now (status 137) if ``point`` is the armed fault point (at its N-th hit)."""
    global _armed, _hits_left
    if _armed is _UNREAD:
        configure(os.environ.get(ENV_VAR))
    if _armed != point:
        return
    _hits_left -= 1
    if _hits_left <= 0:
        os.write(2, f"adloader: fault point {point} hit ({ENV_VAR}), exiting {EXIT_STATUS}\n".encode())
        os._exit(EXIT_STATUS)
