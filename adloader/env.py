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
SUBSTITUTE_VAR = "ADLOADER_SUBSTITUTE"


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


def substitution_on(environ: Mapping[str, str] | None = None) -> bool:
    """``ADLOADER_SUBSTITUTE``: ``1`` (the launcher's default) makes the DataLoaders of a managed
    job's processes adloader's with no code change (adloader.autoload); ``0`` (``adloader run
    --no-substitute``) leaves them torch's. It acts only in a managed job (``ADLOADER_JOB_ID``
    and ``ADLOADER_SOCKET`` set); the launcher also puts the start-up hook's directory first on
    ``PYTHONPATH``, which every process of the job inherits."""
    environ = environ if environ is not None else os.environ
    managed = job_id(environ) is not None and socket_override(environ) is not None
    return managed and environ.get(SUBSTITUTE_VAR, "") == "1"


def managed_environment(base: Mapping[str, str], socket_path: str, job: str, substitute: bool = True) -> dict[str, str]:
    """The environment the launcher gives the training command of a managed job: the socket, the
    job id and, with ``substitute``, the start-up hook on ``PYTHONPATH`` (see :func:`substitution_on`)."""
    from adloader.autoload import BOOT_DIR

    env = dict(base)
    env[SOCKET_VAR] = socket_path
    env[JOB_ID_VAR] = job
    env[SUBSTITUTE_VAR] = "1" if substitute else "0"
    if substitute:
        inherited = env.get("PYTHONPATH")
        entries = [e for e in inherited.split(os.pathsep) if e != str(BOOT_DIR)] if inherited else []
        env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *entries])
    return env
