"""The environment contract between ``adloader run`` (launcher) and the in-job library.

One documented function per variable, as AdaptDL's env.py: the launcher sets
these before it starts the training command, the library reads them. Nothing
here reads the environment at import time.
"""
from __future__ import annotations

import os
from typing import Mapping

SOCKET_VAR = "ADLOADER_SOCKET"
JOB_ID_VAR = "ADLOADER_JOB_ID"


def socket_override(environ: Mapping[str, str] | None = None) -> str | None:
    """``ADLOADER_SOCKET``: the controller's socket path, overriding the default rule of
    :func:`adloader.paths.default_socket_path`. Honoured by the controller, launcher,
    status command and loader alike. Unset or empty: None."""
    value = (environ if environ is not None else os.environ).get(SOCKET_VAR, "")
    return value or None


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """``ADLOADER_JOB_ID``: the id the controller gave this job at registration. Set by the
    launcher only when the job is managed; unset means run unmanaged (keep the configured
    worker count, report nothing)."""
    value = (environ if environ is not None else os.environ).get(JOB_ID_VAR, "")
    return value or None


def rank(environ: Mapping[str, str] | None = None) -> int:
    """``RANK`` (set by torchrun): this process's global rank; 0 when not distributed.
    Each rank's loader reports separately and the controller sums them per job. Without ``RANK``,
    ``LOCAL_RANK``: Lightning's ddp launcher sets only that, and ranks on one node (the controller's
    scope) differ by it."""
    environ = environ if environ is not None else os.environ
    for name in ("RANK", "LOCAL_RANK"):
        value = environ.get(name, "")
        if value.strip().isdigit():
            return int(value)
    return 0


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` (set by torchrun): number of ranks in the job; 1 when not distributed."""
    value = (environ if environ is not None else os.environ).get("WORLD_SIZE", "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else 1


def managed_environment(base: Mapping[str, str], socket_path: str, job: str) -> dict[str, str]:
    """The environment the launcher gives the training command of a managed job."""
    env = dict(base)
    env[SOCKET_VAR] = socket_path
    env[JOB_ID_VAR] = job
    return env
