"""A real controller and the jobs started against it, as subprocesses: the one harness of
the benchmarks (bench/runner.py, behind ``adloader bench`` and ``adloader demo``), the
reliability harness (reliability/) and the end-to-end tests (tests/conftest.py).

:class:`ControllerProcess` is ``python -m adloader controller`` with its own socket,
state directory and cgroup group; :meth:`ControllerProcess.run` starts ``adloader run``
jobs against it, each in a session of its own with its output in files;
:meth:`ControllerProcess.status` asks it for its status. :class:`Cleanup` ends what was
started: it kills the jobs' sessions, stops the controllers, kills whatever is left in
their groups, drains and removes the groups and the temporary directories, so nothing
outlives a run. It ships with bench/ because the benchmarks run real controllers.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from adloader import protocol
from adloader.client import ControllerClient
from adloader.errors import AdloaderError
from adloader.paths import default_lock_dir
from controller.backends.base import BackendError
from controller.backends.cgroupfs import drain_and_rmdir, read_pid_list, write_interface
from controller.backends.placement import cgroups_of
from controller.snapshot import JobSnapshot, NodeSnapshot

REPO = Path(__file__).resolve().parents[1]
"""The checkout the subprocesses run from (their PYTHONPATH starts with it)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
HIERARCHIES = ("cpu", "cpuacct", "cpuset", "blkio")
"""The cgroup v1 hierarchies a controller makes its group in."""
START_TIMEOUT_S = 30.0
NO_CGROUP_V1 = "needs root and a writable cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu"
T = TypeVar("T")


class HarnessError(AdloaderError):
    """A controller or job started here did not do what was waited for (it exited, did not
    answer, or a condition never came true); the message says what, with the log to read."""


def cgroup_v1_usable(root: Path = CGROUP_ROOT) -> bool:
    """Whether this process may write cgroup v1's cpu hierarchy (root, mounted writable)."""
    return os.geteuid() == 0 and os.access(root / "cpu" / "cpu.cfs_quota_us", os.W_OK)


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """``predicate()``'s first truthy value within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(interval)


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; HarnessError naming ``what`` on timeout."""
    value = poll(predicate, timeout, interval)
    if value is None:
        raise HarnessError(f"timed out after {timeout:.1f}s waiting for {what}")
    return value


def base_environment(**extra: str) -> dict[str, str]:
    """This process's environment without adloader's own variables, the checkout first on
    PYTHONPATH, plus ``extra``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ADLOADER_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ.update(extra)
    return environ


def cgroup_of(pid: int, hierarchy: str) -> str | None:
    """The cgroup path of ``pid`` in a v1 hierarchy, from /proc/PID/cgroup (None if it is gone)."""
    return cgroups_of(pid).get(hierarchy)


FORWARDED_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)


def default_signal_dispositions() -> None:
    """preexec_fn: start with the default action for the signals a launcher forwards, as a job
    started from a login shell does. A harness may run under ``nohup`` or as a background job
    of a non-interactive shell, which ignore SIGHUP or SIGINT; an ignored disposition survives
    exec, so the training command would inherit it and ignore the signal sent to it."""
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the session ``proc`` leads (it was started with start_new_session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class JobProcess:
    """One ``adloader run`` launcher (in a session of its own) and what it printed."""

    proc: subprocess.Popen
    name: str
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill_tree(self) -> None:
        """SIGKILL the launcher's whole session (the command and its children)."""
        kill_session(self.proc)

    def output(self) -> tuple[str, str]:
        return self.stdout.read_text(), self.stderr.read_text()


def move_into(cgroup: Path | None) -> None:
    """Move the calling process, every thread of it, into ``cgroup`` (a cgroup v1 directory;
    None: leave it where it is)."""
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text("0")  # 0: the writer itself


def adloader_run_command(*command: str, name: str, options: Sequence[str] = ()) -> list[str]:
    """``adloader run --name NAME [options] -- command...`` as an argv."""
    return [sys.executable, "-m", "adloader", "run", "--name", name, *options, "--", *command]


def launch(argv: Sequence[str], *, name: str, logs: Path, environ: dict[str, str], started: list[JobProcess],
           cgroup: Path | None = None) -> JobProcess:
    """Start ``argv`` (an ``adloader run`` command line) in a session of its own, its output in
    ``logs/NAME-XXXXXX.out`` and ``.err``, inside ``cgroup`` (a cgroup directory; None: where the
    harness is); it is appended to ``started``."""
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    stdout, stderr = logs / f"{tag}.out", logs / f"{tag}.err"

    def prepare() -> None:
        default_signal_dispositions()
        move_into(cgroup)

    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO, env=environ,
                                start_new_session=True, preexec_fn=prepare)
    job = JobProcess(proc=proc, name=name, stdout=stdout, stderr=stderr)
    started.append(job)
    return job


def start_job(socket: Path | None, *command: str, name: str, options: Sequence[str] = (),
              environ: dict[str, str] | None = None, logs: Path, started: list[JobProcess],
              cgroup: Path | None = None) -> JobProcess:
    """``adloader run --name NAME [options] -- command...`` against the controller on ``socket``
    (None leaves ADLOADER_SOCKET as ``environ`` has it); see :func:`launch`."""
    environ = dict(environ if environ is not None else base_environment())
    if socket is not None:
        environ["ADLOADER_SOCKET"] = str(socket)
    return launch(adloader_run_command(*command, name=name, options=options), name=name, logs=logs,
                  environ=environ, started=started, cgroup=cgroup)


@dataclass
class ControllerProcess:
    """``python -m adloader controller`` as a subprocess, with the paths it uses."""

    socket: Path
    state_dir: Path
    group: str
    period: float
    options: tuple[str, ...]
    """More ``adloader controller`` options (``--policy``, ``--cpus``, ...)."""
    log_path: Path
    environ: dict[str, str]
    proc: subprocess.Popen | None = None
    jobs: list[JobProcess] = field(default_factory=list)
    node_cgroup: Path | None = None
    """Where its jobs' launchers start (a cgroup directory); None: where the harness is. The
    benchmark starts them in a cpu group of its own, weighted above the rest of the machine, so
    that the processes a job keeps out of its group (training_processes.py) stay shielded too."""
    control_cgroup: Path | None = None
    """Where the controller itself runs (a cgroup directory); None: where the harness is. The
    benchmark weights it as the jobs' group: left beside a group 64 times its weight, the
    controller of a 6-job mix on 2 cores waited up to 7 s for a CPU in a step that needs 15 ms."""

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, ready: bool = True, timeout: float = START_TIMEOUT_S) -> "ControllerProcess":
        """Start it (again, after stop/kill: same socket, state and group) and, with ``ready``,
        wait until it answers (HarnessError, quoting its log, if it exits or does not)."""
        command = [
            sys.executable, "-m", "adloader", "--log-level", "DEBUG", "controller",
            "--socket", str(self.socket), "--state-dir", str(self.state_dir),
            "--cgroup-group", self.group, "--period", str(self.period), *self.options,
        ]
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=self.environ,
                                         start_new_session=True, preexec_fn=lambda: move_into(self.control_cgroup))
        if ready:
            wait_until(self._answers, timeout, f"the controller on {self.socket} to answer; log:\n{self.log()}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise HarnessError(f"the controller exited with {self.proc.returncode}; log:\n{self.log()}")
        return self.poll_status() is not None

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send ``signum`` and wait for the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signum)
        return self.proc.wait(timeout)

    def shut_down(self, timeout: float = 15.0) -> None:
        """Stop it as an operator would (SIGTERM: it lifts the limits and saves its state); its
        whole session is killed if it has not exited after ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.stop(signal.SIGTERM, timeout)
        except subprocess.TimeoutExpired:
            kill_session(self.proc)

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    # -- talking to it -----------------------------------------------------------------------
    def client(self) -> ControllerClient:
        return ControllerClient(self.socket, timeout=10.0)

    def request(self, message: protocol.Message) -> protocol.Message:
        """One request on a fresh connection; an Error reply is returned, not raised."""
        with self.client() as client:
            return client.request_raw(protocol.encode(message))

    def status(self) -> NodeSnapshot:
        """Its status; ControllerUnavailable if it does not answer, HarnessError for another reply."""
        reply = self.request(protocol.StatusRequest())
        if not isinstance(reply, protocol.Status):
            raise HarnessError(f"the controller on {self.socket} answered a status request with {reply}")
        return reply.node

    def poll_status(self) -> NodeSnapshot | None:
        """Its status, or None while it does not answer one."""
        try:
            return self.status()
        except (AdloaderError, OSError):
            return None

    def job(self, job_id: str) -> JobSnapshot | None:
        return next((j for j in self.status().jobs if j.job_id == job_id), None)

    # -- jobs --------------------------------------------------------------------------------
    def run(self, *command: str, name: str = "test-job", options: tuple[str, ...] = (),
            environ: dict[str, str] | None = None) -> JobProcess:
        """Start ``adloader run --name NAME [options] -- command...`` against this controller."""
        return start_job(self.socket, *command, name=name, options=options, environ=environ,
                         logs=self.log_path.parent, started=self.jobs, cgroup=self.node_cgroup)

    def launch(self, argv: Sequence[str], *, name: str) -> JobProcess:
        """Start a whole ``adloader run`` command line against this controller."""
        environ = base_environment(ADLOADER_SOCKET=str(self.socket))
        return launch(argv, name=name, logs=self.log_path.parent, environ=environ, started=self.jobs,
                      cgroup=self.node_cgroup)

    def registered(self, job: JobProcess, timeout: float = 20.0) -> JobSnapshot:
        """Wait until ``job``'s launcher has registered; its snapshot."""
        def find() -> JobSnapshot | None:
            if job.proc.poll() is not None:
                raise HarnessError(f"launcher {job.name} exited with {job.proc.returncode}: {job.output()}")
            return next((j for j in self.status().jobs if j.launcher_pid == job.pid), None)
        return wait_until(find, timeout, f"job {job.name} to register")

    # -- cgroups -----------------------------------------------------------------------------
    def job_dir(self, hierarchy: str, job_id: str) -> Path:
        return CGROUP_ROOT / hierarchy / self.group / job_id

    def read(self, hierarchy: str, job_id: str, name: str) -> str:
        return (self.job_dir(hierarchy, job_id) / name).read_text().strip()

    def group_pids(self, job_id: str) -> set[int]:
        return read_pid_list(self.job_dir("cpu", job_id) / "cgroup.procs")


class Cleanup:
    """Everything started, to be ended in :meth:`run`: jobs, controllers, their cgroup groups,
    the temporary directories made for them."""

    def __init__(self, graceful: bool = False) -> None:
        """``graceful``: stop the controllers with SIGTERM (they lift limits and save their
        state) rather than SIGKILL."""
        self.graceful = graceful
        self.controllers: list[ControllerProcess] = []
        self.jobs: list[JobProcess] = []
        self.directories: list[Path] = []

    def new_controller(self, options: tuple[str, ...], period: float, environ: dict[str, str],
                       group_prefix: str = "adloader-test") -> ControllerProcess:
        """A controller (not started) whose socket, state and log are in a fresh 0755 directory
        under /tmp (short enough for sun_path, reachable by an unprivileged client) and whose
        group is ``GROUP_PREFIX-<uuid8>``, so parallel runs never collide."""
        directory = Path(tempfile.mkdtemp(prefix="adl-", dir="/tmp"))
        os.chmod(directory, 0o755)
        self.directories.append(directory)
        return self.track(ControllerProcess(
            socket=directory / "s.sock", state_dir=directory / "state", group=f"{group_prefix}-{uuid.uuid4().hex[:8]}",
            period=period, options=options, log_path=directory / "controller.log", environ=environ,
        ))

    def track(self, controller: ControllerProcess) -> ControllerProcess:
        """End ``controller``, its jobs and its group in :meth:`run`."""
        self.controllers.append(controller)
        return controller

    def run(self) -> None:
        for job in self.jobs + [j for c in self.controllers for j in c.jobs]:
            job.kill_tree()  # an exited launcher's command may still run in its session
        for controller in self.controllers:
            if self.graceful:
                controller.shut_down()
            else:
                controller.kill()
        for controller in self.controllers:
            remove_group(controller.group)
            for extra in (controller.node_cgroup, controller.control_cgroup):
                if extra is not None:
                    remove_group(extra.name)
            (default_lock_dir() / f"group-{controller.group}.lock").unlink(missing_ok=True)  # left by a SIGKILL
        for directory in self.directories:
            shutil.rmtree(directory, ignore_errors=True)


def kill_members(procs: Path) -> None:
    """SIGKILL every process a ``cgroup.procs`` file lists (one already gone is fine)."""
    for pid in read_pid_list(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_group(group: str, timeout: float = 10.0, root: Path = CGROUP_ROOT) -> None:
    """Kill whatever still runs in the group and its job cgroups, then remove them and the group.

    A killed process stays in its cgroup for a moment while it exits (rmdir says EBUSY),
    so each directory is retried until ``timeout``."""
    for hierarchy in HIERARCHIES:
        group_dir = root / hierarchy / group
        if not group_dir.is_dir():
            continue
        root_procs = root / hierarchy / "cgroup.procs"
        nested = [Path(d) for d, _, _ in os.walk(group_dir, topdown=False)]  # the deepest first, the group last
        for directory in nested:
            deadline = time.monotonic() + timeout
            while True:
                kill_members(directory / "cgroup.procs")
                try:
                    drain_and_rmdir(directory, lambda d=directory: read_pid_list(d / "cgroup.procs"),
                                    lambda pid: write_interface(root_procs, str(pid), "harness cleanup"))
                    break
                except BackendError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
