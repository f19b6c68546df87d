"""``adloader run``: register the job, then run its command inside the job's cgroup.

Order matters: the controller moves the launcher itself into the job's group while
answering Register, so the command, every rank torchrun starts and every loader
worker are born inside it. The registration connection stays open while the command
runs: the controller reads its closing as "the launcher is gone".

Signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to the command, except
those the terminal sent (si_code SI_KERNEL): the terminal already delivered them
to the command, which shares our process group, and a second Ctrl-C would cut its
clean-up short. The launcher exits with the command's exit code, or 128+N when the
command was killed by signal N, as a shell does.

The controller is looked for where :func:`adloader.paths.client_socket_paths` says (the
system socket, then the user's own), and the one found is handed to the command in
``ADLOADER_SOCKET``. No controller listening is normal: one warning line naming the
paths tried, and the command runs unmanaged.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from adloader import env, protocol
from adloader.client import ControllerClient, connect_first
from adloader.errors import ControllerRefused, ControllerUnavailable

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SI_KERNEL = 0x80
"""siginfo si_code of a signal the kernel sent itself (the terminal's Ctrl-C, Ctrl-\\, hangup)."""
UNMANAGED_CHECK_S = 2.0
"""How often the launcher asks the controller about its job until a loader of the job has
reported or the controller calls it unmanaged (after its grace: ``adloader controller
--unmanaged-after``)."""
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


@dataclass(frozen=True)
class JobRequest:
    command: tuple[str, ...]
    name: str
    gpus: int
    num_workers: int | None = None
    features: dict[str, float] | None = None
    samples: int | None = None
    substitute: bool = True
    """Make the job's DataLoaders adloader's with no code change (adloader.autoload); False: torch's."""


def gpus_from_environment(environ: Mapping[str, str], dev: Path = Path("/dev")) -> int:
    """GPUs named by CUDA_VISIBLE_DEVICES, counted as CUDA does (up to the first invalid
    entry such as -1); set but empty: 0. Unset, CUDA shows the job every GPU of the node: the
    NVIDIA devices under ``dev`` (``nvidia0``, ``nvidia1``, ...), so a CPU-only node's job has
    none (a job without a GPU shows no GPU count or GPU idle; policies still weigh it as one device)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return sum(1 for entry in dev.glob("nvidia*") if entry.name[len("nvidia"):].isdigit())
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def default_name(command: Sequence[str]) -> str:
    """The training script's file name when the command names one (``torchrun ... train.py``),
    else the program's name."""
    script = next((arg for arg in command[1:] if arg.endswith(".py") and not arg.startswith("-")), None)
    return Path(script or command[0]).name


class ManagedJob:
    """The launcher's registration: its open connection and the id the controller gave."""

    def __init__(self, client: ControllerClient, job_id: str, socket_path: str) -> None:
        self.client = client
        self.job_id = job_id
        self.socket_path = socket_path

    def end(self, exit_code: int) -> None:
        """Tell the controller the command exited. A controller restarted meanwhile gets it on
        a fresh connection; none listening at all is fine (it notices the group empty)."""
        message = protocol.End(job_id=self.job_id, exit_code=exit_code)
        for _ in range(2):
            try:
                self.client.request(message)
                break
            except ControllerUnavailable:
                continue
            except ControllerRefused as exc:
                log.debug("controller refused End for job %s: %s", self.job_id, exc)
                break
        self.client.close()


def register(request: JobRequest, socket_paths: Sequence[str | Path]) -> ManagedJob | None:
    """Register with the first controller found at ``socket_paths`` (it moves this process
    into the job's group). None, after one warning line, when the job must run unmanaged."""
    message = protocol.Register(
        name=request.name, gpus=request.gpus, num_workers=request.num_workers, features=request.features,
        samples=request.samples,
    )
    try:
        client = connect_first(socket_paths, timeout=10.0)
        reply = client.request(message)
    except ControllerUnavailable as exc:
        log.warning("%s; running %s unmanaged", exc, request.name)
        return None
    except ControllerRefused as exc:
        client.close()
        log.warning("the controller refused job %s (%s: %s); running it unmanaged", request.name, exc.code,
                    exc.message)
        return None
    if not isinstance(reply, protocol.Registered):
        client.close()
        log.warning("the controller answered Register with %s; running %s unmanaged", reply.TYPE, request.name)
        return None
    log.info("job %s registered as %s (%s backend, group %s)", request.name, reply.job_id, reply.backend,
             reply.cgroup)
    return ManagedJob(client, reply.job_id, client.path)


class UnmanagedWatch:
    """Asks the controller, over the launcher's registration connection, whether a loader of the
    job has reported yet, every ``every`` seconds, and warns once in the job's own output (the
    launcher's stderr) when the controller calls the job unmanaged: a job whose loading adloader
    does not plan must not pass for a managed one. Stops asking once the job's state is settled
    either way, or the controller no longer answers."""

    def __init__(self, client: ControllerClient, job_id: str, every: float = UNMANAGED_CHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.job_id = job_id
        self.every = every
        self._clock = clock
        self._next_at: float | None = clock() + every

    def timeout(self) -> float | None:
        """Seconds until the next question (None: no more questions)."""
        return None if self._next_at is None else max(0.0, self._next_at - self._clock())

    def check(self) -> None:
        """Ask once; warn if the job is unmanaged; schedule the next question while it is starting."""
        self._next_at = None
        try:
            reply = self.client.request(protocol.StatusRequest())
        except (ControllerUnavailable, ControllerRefused) as exc:
            log.debug("could not ask the controller about job %s: %s", self.job_id, exc)
            return
        job = next((j for j in reply.node.jobs if j.job_id == self.job_id), None) \
            if isinstance(reply, protocol.Status) else None
        if job is None:
            return
        if job.state == "unmanaged":
            log.warning("job %s (%s) is unmanaged: %s. It keeps a fair CPU share, but adloader does not plan its "
                        "data loading; to have it managed, load its data with a torch DataLoader (adloader run makes "
                        "it adloader's), or see 'adloader status'", job.name, job.job_id, job.unmanaged_reason)
        elif job.state == "starting":
            self._next_at = self._clock() + self.every


def run_job(request: JobRequest, socket_paths: Sequence[str | Path], environ: Mapping[str, str] | None = None) -> int:
    """Register, run the command to its end, tell the controller; returns the exit code.

    The forwarded signals are held from the start, not only once the command runs: a job
    registers (and its owner may signal it) before the command exists. One that arrives
    before the command starts ends the launch with 128+N instead of starting it."""
    environ = os.environ if environ is None else environ
    with held_signals() as command_mask:
        managed = register(request, socket_paths)
        command_env = dict(environ)
        if managed is not None:
            command_env = env.managed_environment(environ, managed.socket_path, managed.job_id,
                                                  substitute=request.substitute)
        early = signal.sigtimedwait(FORWARDED_SIGNALS, 0)
        if early is not None:
            log.warning("%s arrived before the command started; not starting it",
                        signal.Signals(early.si_signo).name)
            exit_code = 128 + early.si_signo
        else:
            watch = UnmanagedWatch(managed.client, managed.job_id) if managed is not None else None
            exit_code = supervise(request.command, command_env, command_mask, watch)
    if managed is not None:
        managed.end(exit_code)
    return exit_code


@contextmanager
def held_signals() -> Iterator[set[signal.Signals]]:
    """Blocks SIGCHLD and the forwarded signals for the block (so none is lost or kills the
    launcher by default action); yields the mask the command must start with."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would reap the command for us
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, *FORWARDED_SIGNALS})
    try:
        yield previous_mask
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


def supervise(command: Sequence[str], environ: Mapping[str, str], command_mask: set[signal.Signals],
              watch: UnmanagedWatch | None = None) -> int:
    """Run ``command``, forwarding signals to it, and return its exit code (128+N if killed by N).

    Call it inside :func:`held_signals`: the signals stay blocked and are taken with
    sigwaitinfo (sigtimedwait while ``watch`` has a question due), so none is lost between
    the spawn and the wait, and the terminal's own signals can be told apart from kill(2)'s."""
    watched = {signal.SIGCHLD, *FORWARDED_SIGNALS}
    try:
        pid = os.posix_spawnp(
            command[0], list(command), dict(environ),
            setsigmask=command_mask,
            # Python ignores these two; a command expects the defaults (as subprocess's restore_signals).
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    except FileNotFoundError:
        log.error("command not found: %s", command[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        log.error("command not executable: %s", command[0])
        return EXIT_NOT_EXECUTABLE
    while True:
        wait = watch.timeout() if watch is not None else None
        info = signal.sigwaitinfo(watched) if wait is None else signal.sigtimedwait(watched, wait)
        if info is None:  # a question to the controller is due; signals stay queued meanwhile
            assert watch is not None
            watch.check()
            continue
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return exit_code_of(status)
            continue
        if info.si_code == SI_KERNEL:
            continue  # from the terminal: the command, in our process group, has it already
        log.debug("forwarding %s to pid %d", signal.Signals(info.si_signo).name, pid)
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            pass


def exit_code_of(wait_status: int) -> int:
    """A shell's view of a wait status: the exit code, or 128+N for death by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code
