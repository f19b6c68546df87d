"""A node under fault: a real controller subprocess, the emulated jobs started against it,
a cgroup of another owner beside ours, and the invariants that must hold after any fault.

Shared by the reliability tests (tests/test_faults.py, test_load.py) and the benchmark
(reliability/bench.py): the tests assert that :meth:`Node.violations` is empty, the
benchmark counts faults and measures how long the node took to become consistent.

The invariants (``docs/reliability.md`` explains why each one matters):
  * the controller answers;
  * every job group under our parent group belongs to a job the controller lists, in
    every hierarchy, and holds live processes (nothing orphaned, nothing forgotten);
  * no process sits in the parent group itself (a live process moved out of its job's
    group means the controller lost track of it);
  * every process of a job we started that is inside one of our groups is in the group
    of a listed job (every live job adopted);
  * each listed job's limits in the kernel are the ones the controller reports, and the
    policy's (``--policy even``: ``max(0.1, cores / jobs)`` each; ``static``: no quota);
  * the other owner's cgroup keeps its values and its process.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import psutil

from adloader.errors import AdloaderError
from bench.controller_process import (
    CGROUP_ROOT, HIERARCHIES, REPO, ControllerProcess, JobProcess, cgroup_of, poll, remove_group,
)
from controller.backends.cgroupfs import group_gone, read_pid_list, write_interface
from controller.snapshot import NodeSnapshot

JOB_MODULE = "reliability.job"
MIN_CORES = 0.1
"""NodeResources.min_cores_per_job: the even policy's floor."""


@dataclass
class TrackedJob:
    """A job we started, and whether we meant it to stop."""

    handle: JobProcess
    meant_to_end: str | None = None
    """None while it should train on; "killed" (SIGKILL) or "stopped" (SIGTERM) once we ended it."""

    @property
    def alive(self) -> bool:
        """Running; polling also reaps an exited launcher, which would otherwise linger as a
        zombie in its job's group and keep the group from counting as empty."""
        return self.handle.proc.poll() is None

    @property
    def training(self) -> bool:
        """The job's command has printed its first progress line: its SIGTERM handler is in place."""
        return self.alive and self.handle.stdout.exists() and self.handle.stdout.stat().st_size > 0

    def pids(self) -> set[int]:
        """The launcher and every descendant still running."""
        try:
            root = psutil.Process(self.handle.proc.pid)
            return {root.pid} | {p.pid for p in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()


class ForeignGroup:
    """A cgroup of another owner beside ours (``<group>-foreign``) with a CPU quota, a cpuset
    and a sleeping process: the controller must never touch it."""

    QUOTA_US = "37000"

    def __init__(self, name: str, root: Path = CGROUP_ROOT) -> None:
        self.name, self.root = name, root
        self.dirs = {h: root / h / name for h in ("cpu", "cpuset")}
        for hierarchy, directory in self.dirs.items():
            directory.mkdir(exist_ok=True)
            if hierarchy == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    write_interface(directory / knob, (directory.parent / knob).read_text().strip(), "foreign setup")
        write_interface(self.dirs["cpu"] / "cpu.cfs_quota_us", self.QUOTA_US, "foreign setup")
        self.process = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        for directory in self.dirs.values():
            write_interface(directory / "cgroup.procs", str(self.process.pid), "foreign setup")
        self.expected = self.values()

    def values(self) -> dict[str, str]:
        return {
            "quota": (self.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip(),
            "cpus": (self.dirs["cpuset"] / "cpuset.cpus").read_text().strip(),
            "procs": " ".join(sorted(str(p) for p in read_pid_list(self.dirs["cpu"] / "cgroup.procs"))),
            "cpuset_procs": " ".join(sorted(str(p) for p in read_pid_list(self.dirs["cpuset"] / "cgroup.procs"))),
        }

    def touched(self) -> list[str]:
        try:
            now = self.values()
        except FileNotFoundError as exc:
            return [f"the other owner's cgroup was removed: {exc.filename}"]
        return [f"the other owner's cgroup changed: {k} {self.expected[k]!r} -> {v!r}"
                for k, v in now.items() if v != self.expected[k]]

    def remove(self) -> None:
        self.process.kill()
        self.process.wait()
        remove_group(self.name, root=self.root)


@dataclass
class Node:
    """A controller (``--policy even`` or ``static``, ``--cpus 0`` or ``0-1``), the jobs we start
    against it, the other owner's cgroup beside ours, and an unmanaged canary job."""

    controller: ControllerProcess
    cpus: int = 1
    """How many CPUs the controller was given (``--cpus 0`` or ``0-1``): the even policy splits them."""
    policy: str = "even"
    """The controller's ``--policy``: "even", or "static" (no quota at all)."""
    rng: random.Random = field(default_factory=lambda: random.Random(8))
    jobs: list[TrackedJob] = field(default_factory=list)
    foreign: ForeignGroup | None = None
    root: Path = CGROUP_ROOT
    expect_state_file: bool = True
    """Check that the state file matches what the controller lists (off while its directory is unwritable)."""

    canary: subprocess.Popen | None = None
    """The same emulated training, unmanaged and outside our groups, on our jobs' CPUs: its
    longest step is what the machine's own load costs (other work shares it)."""

    def __post_init__(self) -> None:
        self.foreign = ForeignGroup(self.controller.group + "-foreign", self.root)
        self._canary_out = tempfile.TemporaryFile()
        environ = {k: v for k, v in self.controller.environ.items() if not k.startswith("ADLOADER_")}
        self.canary = subprocess.Popen([sys.executable, "-m", JOB_MODULE, "--report-every", "1"],
                                       stdout=self._canary_out, stderr=subprocess.DEVNULL, env=environ,
                                       cwd=REPO, start_new_session=True)
        os.sched_setaffinity(self.canary.pid, set(range(self.cpus)))

    def close(self) -> None:
        """Stop every job we started, the canary, and remove the other owner's cgroup (the
        controller's own fixture removes our groups)."""
        for job in self.jobs:
            job.handle.kill_tree()
        if self.canary is not None:
            self.canary.kill()
            self.canary.wait()
            self._canary_out.close()
            self.canary = None
        if self.foreign is not None:
            self.foreign.remove()
            self.foreign = None

    def canary_gap(self) -> float:
        """The canary's longest step so far (seconds)."""
        from reliability.job import parse_progress

        self._canary_out.seek(0)
        progress = parse_progress(self._canary_out.read().decode())
        return progress.max_step_gap_s if progress is not None else 0.0

    # -- jobs ---------------------------------------------------------------------------------
    def start_job(self, name: str = "train", seconds: float = 600.0, report_every: float = 0.25,
                  loader_workers: int | None = None) -> TrackedJob:
        """Start reliability/job.py under ``adloader run`` (with adloader.DataLoader when
        ``loader_workers`` is given)."""
        loader = ("--dataloader", str(loader_workers)) if loader_workers is not None else ()
        handle = self.controller.run(sys.executable, "-m", JOB_MODULE, "--seconds", str(seconds),
                                     "--report-every", str(report_every), *loader, name=name)
        job = TrackedJob(handle)
        self.jobs.append(job)
        return job

    def start_registered(self, count: int, prefix: str = "steady") -> list[str]:
        """Start ``count`` jobs and wait until each is registered; what went wrong (empty: all did)."""
        jobs = [self.start_job(name=f"{prefix}-{len(self.jobs)}") for _ in range(count)]
        return [f"job {job.handle.name} did not register: {job.handle.output()[1][-300:]}"
                for job in jobs if self.wait_registered(job) is None]

    def reap(self) -> list[TrackedJob]:
        """The jobs still running (exited launchers are reaped on the way)."""
        return [job for job in self.jobs if job.alive]

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM every running job and wait for each to exit (each prints its last progress line)."""
        running = self.reap()
        for job in running:
            self.end_job(job, "stopped")
        for job in running:
            try:
                job.handle.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                job.handle.kill_tree()

    def live_jobs(self) -> list[TrackedJob]:
        return [j for j in self.jobs if j.alive and j.meant_to_end is None]

    def wait_registered(self, job: TrackedJob, timeout: float = 30.0) -> str | None:
        """The job id once ``job``'s launcher is in one of our groups; None if it runs unmanaged
        (no controller answered it) or died."""
        def registered_or_not() -> str | None:
            job_id = self.job_id_of(job.handle.proc.pid)
            if job_id:
                return job_id
            if not job.alive or "unmanaged" in job.handle.output()[1]:
                return "-"
            return None

        found = poll(registered_or_not, timeout)
        return None if found in (None, "-") else found

    def job_id_of(self, pid: int) -> str | None:
        path = cgroup_of(pid, "cpu")
        prefix = f"/{self.controller.group}/"
        if path and path.startswith(prefix):
            return path[len(prefix):].split("/", 1)[0]
        return None

    def churn_once(self, low: int = 2, high: int = 5) -> str:
        """One arrival or departure, keeping between ``low`` and ``high`` live jobs; what it did."""
        live = self.live_jobs()
        if len(live) < low or (len(live) < high and self.rng.random() < 0.5):
            self.start_job(name=f"churn-{len(self.jobs)}")
            return "arrival"
        self.end_job(self.rng.choice(live), self.rng.choice(("killed", "stopped")))
        return "departure"

    def end_job(self, job: TrackedJob, how: str) -> None:
        """End ``job``: "killed" SIGKILLs its whole tree, "stopped" SIGTERMs the launcher (which
        forwards it to the command). A job still starting up is killed: a SIGTERM before Python
        has installed its handlers would end it uncleanly, and say nothing about the controller."""
        job.meant_to_end = how if how == "killed" or job.training else "killed"
        if job.meant_to_end == "killed":
            job.handle.kill_tree()
        else:
            job.handle.proc.send_signal(signal.SIGTERM)

    # -- invariants ---------------------------------------------------------------------------
    def answers(self) -> bool:
        try:
            self.controller.status()
        except AdloaderError:
            return False
        return True

    def violations(self) -> list[str]:
        """Every invariant that does not hold right now (empty: the node is consistent)."""
        self.reap()
        try:
            status = self.controller.status()
        except AdloaderError as exc:
            return [f"the controller does not answer: {exc}"]
        listed = {j.job_id: j for j in status.jobs}
        found: list[str] = []
        group_dirs = {h: self.root / h / self.controller.group for h in HIERARCHIES}
        for hierarchy, group_dir in group_dirs.items():
            present = {d.name for d in group_dir.iterdir() if d.is_dir()} if group_dir.is_dir() else set()
            found += [f"orphaned group {hierarchy}/{j}: not listed by the controller" for j in sorted(present - set(listed))]
            found += [f"job {j} is listed but has no {hierarchy} group" for j in sorted(set(listed) - present)]
            stray = read_pid_list(group_dir / "cgroup.procs") - _zombies()
            if stray:
                found.append(f"process(es) {sorted(stray)} moved out of their job's group into {hierarchy}/"
                             f"{self.controller.group}: the controller lost track of them")
        for job_id in listed:
            if not read_pid_list(group_dirs["cpu"] / job_id / "cgroup.procs"):
                found.append(f"job {job_id} is listed but its group holds no live process")
        for job in self.jobs:
            for pid in job.pids():
                job_id = self.job_id_of(pid)
                if job_id is not None and job_id not in listed:
                    found.append(f"pid {pid} of {job.handle.name} is in group {job_id}, which the controller "
                                 "does not list: a live job was not adopted")
        found += self._limit_violations(status, group_dirs)
        if self.expect_state_file:
            found += self._state_file_violations(set(listed))
        if self.foreign is not None:
            found += self.foreign.touched()
        return found

    def _limit_violations(self, status: NodeSnapshot, group_dirs: dict[str, Path]) -> list[str]:
        found = []
        want = max(MIN_CORES, self.cpus / len(status.jobs)) if status.jobs and self.policy == "even" else None
        for job in status.jobs:
            if (job.cores is None) != (want is None) or (want is not None and abs(job.cores - want) > 1e-6):
                found.append(f"job {job.job_id}: the controller says {job.cores} cores, the {self.policy} policy "
                             f"gives {want}")
            try:
                quota = int((group_dirs["cpu"] / job.job_id / "cpu.cfs_quota_us").read_text())
                cpus = (group_dirs["cpuset"] / job.job_id / "cpuset.cpus").read_text().strip()
            except ValueError:
                continue  # not a number: judged again at the next poll
            except OSError as exc:
                if not group_gone(exc):
                    raise
                continue  # reported above as a missing group, or removed as it was read (the job departed)
            if quota != (-1 if job.cores is None else round(job.cores * 100_000)):
                found.append(f"job {job.job_id}: kernel quota {quota} us, not the {job.cores} cores the controller "
                             "reports: its limits were not restored")
            if job.cpus is not None and cpus != _format_cpus(job.cpus):
                found.append(f"job {job.job_id}: kernel cpuset {cpus!r}, the controller reports {job.cpus}")
        return found

    def _state_file_violations(self, listed: set[str]) -> list[str]:
        """The state file on disk names exactly the listed jobs, and no save is left half done."""
        directory = self.controller.state_dir
        if (directory / "state.json.tmp").exists():
            return [f"{directory / 'state.json.tmp'} is left over from an unfinished save"]
        try:
            saved = set(json.loads((directory / "state.json").read_bytes())["payload"]["jobs"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"the state file is unreadable: {exc}"]
        if saved != listed:
            return [f"the state file names jobs {sorted(saved)}, the controller lists {sorted(listed)}"]
        return []

    def wait_consistent(self, timeout: float) -> tuple[float, list[str]]:
        """Seconds until :meth:`violations` was first empty (the violations left after ``timeout``)."""
        started = time.monotonic()
        left: list[str] = []

        def consistent() -> bool:
            nonlocal left
            left = self.violations()
            return not left

        poll(consistent, timeout, interval=0.02)
        return time.monotonic() - started, left

    def training_stopped(self, max_gap_s: float) -> list[str]:
        """Jobs whose training stopped although we never ended them: they exited with a nonzero
        status, or a step took longer than ``max_gap_s`` and than three times the canary's
        longest (a job in a cgroup shares its group's CPU weight with its siblings, so on a
        loaded machine its steps stretch further than the canary's without stopping)."""
        from reliability.job import parse_progress

        allowed = max(max_gap_s, 3 * self.canary_gap())
        found = []
        for job in self.jobs:
            code = job.handle.proc.poll()
            if job.meant_to_end is None and code not in (None, 0):
                found.append(f"{job.handle.name} exited with {code} without being told to: {job.handle.output()[1][-500:]}")
            if job.meant_to_end == "stopped" and code not in (None, 0):
                found.append(f"{job.handle.name} did not stop cleanly on SIGTERM: exit {code}")
            progress = parse_progress(job.handle.output()[0])
            if progress is not None and progress.max_step_gap_s > allowed:
                ended = time.strftime("%H:%M:%S", time.localtime(progress.max_step_gap_ended or 0))
                found.append(f"{job.handle.name} stalled: a step took {progress.max_step_gap_s:.2f}s (until {ended}); "
                             f"the unmanaged canary's longest: {self.canary_gap():.2f}s")
        return found


def _zombies() -> set[int]:
    """Exited processes not yet reaped still appear in cgroup.procs for a moment."""
    zombies = set()
    for process in psutil.process_iter(["status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            zombies.add(process.pid)
    return zombies


def _format_cpus(cpus: Sequence[int]) -> str:
    from adloader.cpuspec import format_cpus

    return format_cpus(tuple(cpus))
