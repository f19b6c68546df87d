"""Shared fixtures: a real ``adloader controller`` subprocess and real ``adloader run`` jobs.

- ``start_controller(*options, period=0.5, environ=None, ready=True, socket=None)``: a factory that
  starts ``python -m adloader controller`` with a socket in a fresh 0755 directory
  under /tmp, a temp state dir and a unique cgroup group (``adloader-test-<uuid8>``),
  (``socket`` replaces the socket path) plus ``options`` (e.g. ``"--policy", "even", "--cpus", "0"``). Returns a
  :class:`bench.controller_process.ControllerProcess`: ``.status()``, ``.request(msg)``,
  ``.run(*command, name=...)`` to start a job against it, ``.registered(job)`` to wait
  for its registration, ``.stop(sig)``, ``.kill()``, ``.start()`` (restart), ``.log()``.
- ``controller``: one such controller with ``--policy even --cpus 0`` and a 0.5 s period.
- ``users``: two unprivileged system users created for the session (removed at its end).
- ``start_job(*command, name=..., socket=None, environ=None)``: ``adloader run`` without
  a controller fixture (socket None: no controller listening).

The finaliser SIGKILLs every controller and job the test started (including anything
left in the test's cgroups) and removes the groups and the temp directories. Tests
that need real cgroups should skip with ``fixtures.managed.NO_CGROUP_V1`` when
``CGROUP_V1_USABLE`` is false. The controller and job processes themselves are the
harness the benchmarks and reliability/ use too (bench/controller_process.py).
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
import traceback
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from bench.controller_process import Cleanup, ControllerProcess, JobProcess, base_environment, start_job as _start_job
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1


TEST_LIMIT_S = 600
"""No test may run longer: past it, every thread's stack and the test's name are printed and the
run ends (exit 1), so a hang says where it is instead of running into CI's time limit in silence."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    def overran() -> None:
        """Innermost frames last and the test's name at the very end: the tail of a log says it all."""
        stacks = sys._current_frames()
        main = stacks.pop(threading.main_thread().ident, None)
        with item.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            for ident, frame in [*stacks.items(), (threading.main_thread().ident, main)]:
                if frame is not None and ident != threading.get_ident():
                    print(f"\nthread {ident}:\n" + "".join(traceback.format_stack(frame)[-12:]), file=sys.stderr)
            print(f"{item.nodeid} ran past {TEST_LIMIT_S} s (its main thread's stack is the last above)",
                  file=sys.stderr, flush=True)
        os._exit(1)

    watchdog = threading.Timer(TEST_LIMIT_S, overran)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()


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
              ready: bool = True, socket: Path | None = None) -> ControllerProcess:
        controller = _cleanup.new_controller(tuple(options), period, environ or base_environment())
        if socket is not None:
            controller.socket = socket
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


@pytest.fixture(scope="session")
def users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    """Two unprivileged system users of our own, removed after the session."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create the test users")
    tag = uuid.uuid4().hex[:6]
    names = [f"adl-t{tag}-{i}" for i in (1, 2)]
    created = []
    try:
        for name in names:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            created.append(name)
        yield pwd.getpwnam(names[0]), pwd.getpwnam(names[1])
    finally:
        for name in created:
            subprocess.run(["userdel", name], check=False, capture_output=True)


TIERS: dict[str, tuple[str, ...]] = {
    "pure": (
        "test_protocol", "test_cpuspec", "test_curves", "test_curve_phases", "test_simulator", "test_policies", "test_policies_properties", "test_bench_mix", "test_bench_first_plans", "test_bench_machine",
        "test_registry", "test_registry_policy_inputs", "test_worker_memory_reads", "test_placement", "test_safety_net", "test_flapping", "test_change_rate",
        "test_completion_check", "test_outgrown", "test_adaptive_rules", "test_pending_queue", "test_bench_queue", "test_remaining_lengths", "test_unmanaged_share",
        "test_history", "test_peer", "test_throughput_model_features", "test_throughput_model_fit",
    ),
    "in_process": ("test_backend_v2", "test_layouts_v2", "test_metrics", "test_controller_in_process"),
    "real_cgroups": (
        "test_backends_v1", "test_backend_v2_kernel", "test_loop", "test_reconciler", "test_cpu_weight", "test_layouts_v1",
        "test_backend_detect",
        "test_state", "test_worker_memory", "test_backend_affinity", "test_trainer_stall",
    ),
    "end_to_end": (
        "test_controller_e2e", "test_controller_lifecycle", "test_cpu_wait", "test_server", "test_launcher", "test_status", "test_authz",
        "test_faults", "test_fuzz_socket", "test_load", "test_node_memory", "test_reporter", "test_torchrun",
        "test_bench_e2e", "test_prometheus", "test_deploy", "test_dataloader", "test_dataloader_properties",
        "test_dataloader_torch_parity", "test_dataloader_frameworks", "test_unchanged_programs", "test_dataloader_state", "test_socket_discovery", "test_slurm", "test_slurm_queue", "test_install", "test_packaging",
        "test_cli", "test_unmanaged", "test_throughput_model_cli", "test_throughput_model_api", "test_restart_resumes_plan",
        "test_training_processes", "test_autoload", "test_worker_targets", "test_doctor", "test_step_timer", "test_bench_gpu",
        "test_bench_gil_step",
    ),
}
"""Each test file's tier (README, "Tests"): ``pytest -m pure`` runs in seconds anywhere;
``-m in_process`` builds controller objects in the test process on fixture trees;
``-m real_cgroups`` writes the machine's cgroups (root); ``-m end_to_end`` runs real
controller and job subprocesses. A file's heaviest test decides its tier."""
_TIER_OF = {module: tier for tier, modules in TIERS.items() for module in modules}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its file's tier; a file not in TIERS counts as end to end (the
    heaviest) and is named once in a warning, so that it gets placed."""
    unplaced = set()
    for item in items:
        if any(item.get_closest_marker(t) is not None for t in TIERS):
            continue
        tier = _TIER_OF.get(item.path.stem)
        if tier is None:
            tier = "end_to_end"
            unplaced.add(item.path.stem)
        item.add_marker(getattr(pytest.mark, tier))
    if unplaced:
        config.issue_config_time_warning(pytest.PytestWarning(
            f"test files in no tier, run as end_to_end (add them to TIERS in tests/conftest.py): {sorted(unplaced)}"
        ), stacklevel=1)
