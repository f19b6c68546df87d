"""Shared fixtures: a real ``adloader controller`` subprocess and real ``adloader run`` jobs.

- ``start_controller(*options, period=0.5, environ=None, ready=True)``: a factory that
  starts ``python -m adloader controller`` with a socket in a fresh 0755 directory
  under /tmp, a temp state dir and a unique cgroup group (``adloader-test-<uuid8>``),
  plus ``options`` (e.g. ``"--policy", "even", "--cpus", "0"``). Returns a
  :class:`fixtures.managed.ControllerProcess`: ``.status()``, ``.request(msg)``,
  ``.run(*command, name=...)`` to start a job against it, ``.registered(job)`` to wait
  for its registration, ``.stop(sig)``, ``.kill()``, ``.start()`` (restart), ``.log()``.
- ``controller``: one such controller with ``--policy even --cpus 0`` and a 0.5 s period.
- ``start_job(*command, name=..., socket=None, environ=None)``: ``adloader run`` without
  a controller fixture (socket None: no controller listening).

The finaliser SIGKILLs every controller and job the test started (including anything
left in the test's cgroups) and removes the groups and the temp directories. Tests
that need real cgroups should skip with ``fixtures.managed.NO_CGROUP_V1`` when
``CGROUP_V1_USABLE`` is false.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from fixtures.managed import (
    CGROUP_V1_USABLE,
    NO_CGROUP_V1,
    Cleanup,
    ControllerProcess,
    JobProcess,
    base_environment,
    start_job as _start_job,
)


@pytest.fixture
def _cleanup() -> Iterator[Cleanup]:
    cleanup = Cleanup()
    yield cleanup
    cleanup.run()


@pytest.fixture
def start_controller(_cleanup: Cleanup) -> Callable[..., ControllerProcess]:
    if not CGROUP_V1_USABLE:
        pytest.skip(NO_CGROUP_V1)

    def start(*options: str, period: float = 0.5, environ: dict[str, str] | None = None,
              ready: bool = True) -> ControllerProcess:
        controller = _cleanup.new_controller(tuple(options), period, environ or base_environment())
        return controller.start(ready=ready)

    return start


@pytest.fixture
def controller(start_controller: Callable[..., ControllerProcess]) -> ControllerProcess:
    return start_controller("--policy", "even", "--cpus", "0")


@pytest.fixture
def start_job(_cleanup: Cleanup) -> Callable[..., JobProcess]:
    logs = Path(tempfile.mkdtemp(prefix="adl-jobs-", dir="/tmp"))
    _cleanup.directories.append(logs)

    def start(*command: str, name: str = "test-job", socket: Path | str | None = None,
              options: tuple[str, ...] = (), environ: dict[str, str] | None = None) -> JobProcess:
        environ = dict(environ if environ is not None else base_environment())
        environ["ADLOADER_SOCKET"] = str(socket) if socket is not None else str(logs / "no-controller.sock")
        return _start_job(None, *command, name=name, options=options, environ=environ, logs=logs,
                          started=_cleanup.jobs)

    return start
