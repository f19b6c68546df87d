"""Crash the controller during a busy run and check what a restart finds.

Two kinds of crash, both a real SIGKILL-like death of the controller process:
  * at a named fault point (``ADLOADER_FAULT_POINT=NAME@N``, controller/faults.py): the
    windows that matter, e.g. after the new state is in the temp file but before the
    rename, or between two jobs' cgroup writes;
  * ``kill -9`` at a random moment while jobs arrive and leave.

After each crash the controller is restarted and the node must become consistent
(:meth:`reliability.node.Node.violations` empty) within ``settle_s``; the time it
took is recorded. Jobs keep training throughout (checked at the end by the caller with
``Node.training_stopped``).
"""
from __future__ import annotations

import os
import random
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from adloader import protocol
from adloader.protocol import NodeSnapshot
from bench.controller_process import HarnessError, poll
from reliability.node import Node, TrackedJob
from controller import faults

FAULT_POINTS: dict[str, str] = {
    "register.after_cgroup": "arrival",
    "state.after_temp_write@3": "churn",
    "reconcile.between_jobs@2": "churn",
    "loop.after_reconcile@3": "churn",
    "remove.mid_removal": "departure",
    "adopt.mid_adoption": "restart",
}
"""Fault point spec -> what makes a running controller reach it. ``@N`` skips the hits a
restarted controller's own recovery makes (its save, its first reconcile), so the crash
lands in the busy run; "restart" points are reached by recovery itself."""


@dataclass
class CrashOutcome:
    fault: str
    """The fault point spec, or "kill -9 after X s"."""
    crashed: bool
    """The controller died where it was meant to (the fault point's line in its log, status 137)."""
    ready_s: float
    """Restart until the controller answered (its recovery and first control step are done by then)."""
    consistent_s: float | None
    """Restart answered until every invariant held; None if they never did within the deadline."""
    violations: list[str] = field(default_factory=list)
    initially: list[str] = field(default_factory=list)
    """What did not hold yet at the first check after the restart answered (transient, or not)."""


def restart_and_check(node: Node, fault: str, crashed: bool, settle_s: float) -> CrashOutcome:
    """Start the controller again (unarmed) and wait until the node is consistent."""
    controller = node.controller
    controller.environ.pop(faults.ENV_VAR, None)
    started = time.monotonic()
    try:
        controller.start(ready=True)
    except HarnessError as exc:  # it exited or never answered: a crash loop in the making
        return CrashOutcome(fault, crashed, time.monotonic() - started, None,
                            [f"the controller did not come back: {exc}"])
    ready = time.monotonic()
    initially = node.violations()
    violations = node.wait_consistent(settle_s)[1] if initially else []
    return CrashOutcome(fault, crashed, ready - started, None if violations else time.monotonic() - ready,
                        violations, initially)


def crash_at_fault_point(node: Node, spec: str, settle_s: float, timeout: float = 60.0) -> CrashOutcome:
    """Restart the controller armed with ``spec``, drive it there (FAULT_POINTS says how),
    then restart it unarmed and check the node."""
    controller = node.controller
    name = spec.partition("@")[0]
    marker = f"fault point {name} hit"
    for _ in range(5):  # at least two managed jobs: something to adopt, to end, to reallocate between
        if len([j for j in node.live_jobs() if node.job_id_of(j.handle.proc.pid)]) >= 2:
            break
        node.wait_registered(node.start_job(name=f"steady-{len(node.jobs)}"))
    hits_before = controller.log().count(marker)
    controller.kill()
    controller.environ[faults.ENV_VAR] = spec
    controller.start(ready=False)
    poll(lambda: controller.proc.poll() is not None or node.answers(), timeout)
    trigger = FAULT_POINTS.get(spec, "churn")
    deadline = time.monotonic() + timeout
    while controller.proc is not None and controller.proc.poll() is None and time.monotonic() < deadline:
        if trigger == "arrival":
            node.start_job(name=f"arrival-{len(node.jobs)}")
        elif trigger == "departure" and node.live_jobs():
            node.end_job(node.rng.choice(node.live_jobs()), node.rng.choice(("killed", "stopped")))
        elif trigger in ("churn", "departure"):
            node.churn_once()
        poll(lambda: controller.proc.poll() is not None, 1.5 * controller.period)
    controller.kill()  # it is dead already unless the point was never reached (crashed stays False)
    crashed = controller.proc is not None and controller.proc.returncode == 137 and \
        controller.log().count(marker) > hits_before
    return restart_and_check(node, spec, crashed, settle_s)


def crash_during_churn(node: Node, kills: int, settle_s: float, rng: random.Random) -> list[CrashOutcome]:
    """``kills`` times: let jobs arrive and leave for a random while, SIGKILL the controller
    mid-run, let a job come or go while it is down, restart it and check the node."""
    outcomes = []
    for _ in range(kills):
        busy_for = rng.uniform(0.3, 2.5)
        busy_until = time.monotonic() + busy_for
        while time.monotonic() < busy_until:
            node.churn_once()
            time.sleep(rng.uniform(0.05, 0.5))
        node.controller.kill()
        if rng.random() < 0.5:
            node.churn_once()  # a job arrives (and runs unmanaged) or leaves while no controller runs
        outcomes.append(restart_and_check(node, f"kill -9 after {busy_for:.2f}s of churn", True, settle_s))
    return outcomes


@dataclass
class PlanResumption:
    """One kill -9 of a controller planning adaptively, and its restart."""

    before: dict[str, list]
    """Each job's applied [cpu_weight, cores, workers target, read_bps] just before the kill."""
    after: dict[str, list]
    """The same at the first status after the restart (its first control step is done by then)."""
    periods_to_match: int | None
    """Control periods after the restart until the plan was ``before`` again (0: at the first
    step); None if it never was within the limit."""


def plan_of(status: NodeSnapshot) -> dict[str, list]:
    """Each job's applied allocation, as the status shows it."""
    return {j.job_id: [j.cpu_weight, j.cores, j.workers_target, j.read_bps] for j in status.jobs}


def kill_and_resume(node: Node, max_periods: int = 40) -> PlanResumption:
    """SIGKILL the controller, restart it, and count the periods until the plan it had is back."""
    controller = node.controller
    before = plan_of(controller.status())
    controller.kill()
    controller.start(ready=True)
    after = plan_of(controller.status())
    for periods in range(max_periods + 1):
        if plan_of(controller.status()) == before:
            return PlanResumption(before, after, periods)
        time.sleep(controller.period)
    return PlanResumption(before, after, None)


@dataclass
class JobFaultOutcome:
    fault: str
    cleanup_s: float | None
    """From the job's last process gone to its group gone (None: not applicable or never)."""
    violations: list[str] = field(default_factory=list)


def dying_jobs(node: Node, settle_s: float, vanishing: int = 10) -> list[JobFaultOutcome]:
    """Jobs that die in every way a job dies, one after another; each must be removed (or
    kept, while a process of it lives) and leave the node consistent."""
    period = node.controller.period
    outcomes = []

    job = _registered(node, "sigkilled")
    job_id = node.job_id_of(job.handle.proc.pid)
    pids = job.pids()
    node.end_job(job, "killed")
    outcomes.append(_removal("SIGKILL of a job's whole tree", node, job_id, pids, settle_s))

    job = _registered(node, "orphaned-command")
    job_id = node.job_id_of(job.handle.proc.pid)
    command = job.pids() - {job.handle.proc.pid}
    os.kill(job.handle.proc.pid, signal.SIGKILL)
    job.handle.proc.wait()
    time.sleep(3 * period)  # several steps: the job must be kept while its command lives
    kept = job_id in {j.job_id for j in node.controller.status().jobs} and bool(_alive(command))
    job.meant_to_end = "killed"
    job.handle.kill_tree()
    for pid in _alive(command):
        os.kill(pid, signal.SIGKILL)
    outcome = _removal("launcher SIGKILLed, its command lives on, then dies", node, job_id, command, settle_s)
    if not kept:
        outcome.violations.insert(0, "the job was dropped while its command still ran")
    outcomes.append(outcome)

    for _ in range(vanishing):
        register_and_vanish(node.controller.socket)
    _, left = node.wait_consistent(settle_s)
    outcomes.append(JobFaultOutcome(f"{vanishing} processes that send Register and exit at once", None, left))

    quick = [node.controller.run("true", name=f"instant-{i}") for i in range(4)]
    for handle in quick:
        handle.proc.wait(60)
    _, left = node.wait_consistent(settle_s)
    left += [f"{h.name} exited {h.proc.returncode}" for h in quick if h.proc.returncode != 0]
    outcomes.append(JobFaultOutcome("4 jobs whose command exits while its limits are written", None, left))
    return outcomes


def register_and_vanish(socket_path: Path) -> None:
    """Fork a process that sends Register and exits without waiting for the reply: the
    controller finds it gone while it makes the job's group or moves it in."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(socket_path))
                sock.sendall(protocol.encode(protocol.Register(name="vanishing")))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _registered(node: Node, name: str) -> TrackedJob:
    job = node.start_job(name=name)
    if node.wait_registered(job) is None:
        raise AssertionError(f"job {name} did not register: {job.handle.output()}")
    poll(lambda: len(job.pids()) > 1, 30)  # its command has started
    return job


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def _removal(fault: str, node: Node, job_id: str | None, pids: set[int], settle_s: float) -> JobFaultOutcome:
    """Wait for ``pids`` to be gone, then time how long until the job's group is gone too."""
    poll(lambda: not _alive(pids), settle_s)
    gone_at = time.monotonic()
    group = node.root / "cpu" / node.controller.group / str(job_id)
    removed = poll(lambda: not group.exists(), settle_s, interval=0.01)
    cleanup_s = time.monotonic() - gone_at if removed else None
    _, left = node.wait_consistent(settle_s)
    if job_id is None:
        left.insert(0, "the job never registered")
    return JobFaultOutcome(fault, cleanup_s, left)


@dataclass
class AwayOutcome:
    fault: str
    steps_while_away: int
    """Training steps the job made while no controller ran."""
    reconnect_s: float | None
    """Restart answered until the job's loader had reported to the new controller."""
    violations: list[str] = field(default_factory=list)


def controller_away(node: Node, how: str, away_steps: int = 20, timeout: float = 60.0) -> AwayOutcome:
    """A job loading through adloader.DataLoader takes the controller's worker target; the
    controller then goes away (``how``: "SIGKILL", or "SIGTERM", which lifts the limits)
    while the job makes ``away_steps`` steps, and comes back. The job must train on at its
    last worker count (and, after a SIGKILL, its last CPU quota), and its loader must
    report to the new controller. ``node`` must have started with ``--cpus 0-1`` and
    ``--policy even`` and have no other job: the job then gets 2 cores and 2 workers."""
    from reliability.job import Progress, parse_progress

    controller = node.controller
    found: list[str] = []
    job = node.start_job(name=f"loader-{how}", loader_workers=1)
    job_id = node.wait_registered(job, timeout)
    if job_id is None:
        return AwayOutcome(f"controller {how}", 0, None, [f"the job did not register: {job.handle.output()}"])

    def progress_where(condition: Callable[[Progress], bool]) -> Progress | None:
        progress = parse_progress(job.handle.output()[0])
        return progress if progress is not None and condition(progress) else None

    before = poll(lambda: progress_where(lambda p: p.target_workers == 2), timeout)
    quota_file = node.root / "cpu" / controller.group / job_id / "cpu.cfs_quota_us"
    quota = int(quota_file.read_text())
    if before is None or quota != 200_000:
        return AwayOutcome(f"controller {how}", 0, None, [f"the job never ran at 2 workers and 2 cores: {quota}"])
    if how == "SIGKILL":
        controller.kill()
    else:
        controller.proc.send_signal(signal.SIGTERM)
        if controller.proc.wait(30) != 0:
            found.append(f"the controller exited {controller.proc.returncode} on SIGTERM")
    away = poll(lambda: progress_where(lambda p: p.steps >= before.steps + away_steps), timeout)
    if away is None or not job.alive:
        found.append("training did not go on while the controller was away")
    elif away.target_workers != 2:
        found.append(f"the loader left its last worker count: {away.target_workers}")
    lifted = how == "SIGTERM"
    if int(quota_file.read_text()) != (-1 if lifted else quota):
        found.append(f"quota while away is {quota_file.read_text().strip()}, expected {-1 if lifted else quota}")
    controller.start()
    ready = time.monotonic()

    def reported() -> bool:
        listed = next((j for j in controller.status().jobs if j.job_id == job_id), None)
        return listed is not None and listed.ranks_reporting == 1 and listed.samples_total >= (away or before).samples

    reconnect_s = time.monotonic() - ready if poll(reported, timeout, interval=0.1) else None
    if reconnect_s is None:
        found.append("the loader never reported to the restarted controller")
    if int(quota_file.read_text()) != quota:
        found.append(f"the restarted controller did not restore the quota: {quota_file.read_text().strip()}")
    return AwayOutcome(f"controller {how}", (away.steps - before.steps) if away else 0, reconnect_s, found)
