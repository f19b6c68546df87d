"""Nested placement on the real cgroup v1 mounts, in the layouts kubelet and systemd make.

No kubelet or systemd can run here, so each test builds the cgroups they would
(kubelet's cgroupfs driver ``kubepods/burstable/pod<uid>/<container>``, its systemd
driver ``kubepods.slice/kubepods-burstable.slice/...pod<uid>.slice/cri-containerd-<id>.scope``,
systemd's ``system.slice/<x>.service`` and ``user.slice/user-0.slice/session-N.scope``)
in every v1 hierarchy, under a unique ``adloader-test-<uuid8>-layout`` directory, and
starts ``adloader run`` inside them as the scheduler would (a shell that joins them
and execs it). Then the invariants: every process stays in the scheduler's cgroups,
adloader's group is nested below them, CPUs stay inside the scheduler's cpuset, the
plan is enforced across parents, the scheduler's kill leaves no group behind.
"""
from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import psutil
import pytest

from controller.backends.placement import cgroups_of
from controller.backends.cgroupfs import write_interface
from bench.controller_process import CGROUP_ROOT, REPO, ControllerProcess, JobProcess, kill_members, wait_until

PERIOD = 0.5
ALL = ("cpu", "cpuacct", "cpuset", "memory", "blkio", "freezer", "pids", "devices")
MANAGED = ("cpu", "cpuacct", "cpuset", "blkio")
BUSY = "import os; os.fork(); exec('while True: pass')"  # two busy processes: more than the plan gives

LAYOUTS = {
    "kubelet-cgroupfs": ("kubernetes", "kubepods/burstable/pod{uid}/{cid}"),
    "kubelet-systemd": ("kubernetes", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                                      "cri-containerd-{cid}.scope"),
    "systemd-service": ("systemd", "system.slice/train-{cid}.service"),
    "systemd-session": ("systemd", "user.slice/user-0.slice/session-{cid}.scope"),
}


class Layouts:
    """Scheduler-made cgroups under one unique top directory per hierarchy, removed at the end."""

    def __init__(self) -> None:
        self.top = f"adloader-test-{uuid.uuid4().hex[:8]}-layout"

    def make(self, template: str, cpus: str) -> str:
        """Create the layout's cgroups in every hierarchy; its path as /proc/PID/cgroup shows it."""
        relative = f"{self.top}/" + template.format(uid=uuid.uuid4(), cid=uuid.uuid4().hex[:12])
        for hierarchy in ALL:
            directory = CGROUP_ROOT / hierarchy
            for part in relative.split("/"):
                directory = directory / part
                directory.mkdir(exist_ok=True)
                if hierarchy == "cpuset":  # a new v1 cpuset is empty: as kubelet's cpu manager, give it CPUs
                    (directory / "cpuset.mems").write_text((directory.parent / "cpuset.mems").read_text())
                    (directory / "cpuset.cpus").write_text(cpus)
        return "/" + relative

    def command(self, path: str, *argv: str) -> tuple[str, ...]:
        """A shell that joins ``path`` in every hierarchy, as the scheduler puts a container's or
        unit's first process there, then execs ``argv``."""
        joins = "; ".join(f"echo $$ > {CGROUP_ROOT / h}{path}/cgroup.procs" for h in ALL)
        return ("/bin/sh", "-c", f"{joins}; exec {shlex.join(argv)}")

    def kill(self, path: str) -> None:
        """What pod deletion or `systemctl stop` does: SIGKILL every process in the scheduler's cgroup."""
        for procs in sorted((CGROUP_ROOT / "freezer" / path.lstrip("/")).rglob("cgroup.procs")):
            kill_members(procs)

    def remove(self) -> None:
        """Kill what is left, move nothing (all dead), and remove every directory bottom-up."""
        for hierarchy in ALL:
            top = CGROUP_ROOT / hierarchy / self.top
            if not top.exists():
                continue
            directories = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)) + [top]
            for directory in directories:
                deadline = time.monotonic() + 10
                while directory.exists():
                    kill_members(directory / "cgroup.procs")
                    try:
                        directory.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)


@pytest.fixture
def layouts() -> Iterator[Layouts]:
    made = Layouts()
    yield made
    made.remove()


def _job_in(controller: ControllerProcess, layouts: Layouts, path: str, name: str, code: str) -> tuple[JobProcess, str]:
    """``adloader run --name NAME -- python -c CODE`` started inside the scheduler's cgroups at ``path``."""
    logs = controller.log_path.parent
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen(
            layouts.command(path, sys.executable, "-m", "adloader", "run", "--name", name, "--",
                            sys.executable, "-c", code),
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
            env={**controller.environ, "ADLOADER_SOCKET": str(controller.socket)},
        )
    job = JobProcess(proc=proc, name=name, stdout=stdout, stderr=stderr)
    controller.jobs.append(job)  # killed by the fixtures' finaliser
    return job, controller.registered(job).job_id


def _tree(job: JobProcess, at_least: int) -> list[psutil.Process]:
    launcher = psutil.Process(job.pid)  # the shell exec'd adloader run: the same pid
    return wait_until(lambda: len(launcher.children(recursive=True)) + 1 >= at_least
                      and [launcher, *launcher.children(recursive=True)], 20, "the job's processes")


def _usage(cpuacct_dirs: list[Path]) -> list[int]:
    return [int((d / "cpuacct.usage").read_text()) for d in cpuacct_dirs]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_job_stays_in_its_schedulers_cgroups_and_its_cpuset_and_its_group_goes_with_it(
    start_controller: Callable[..., ControllerProcess], layouts: Layouts, layout: str
) -> None:
    scheduler, template = LAYOUTS[layout]
    controller = start_controller("--policy", "even", "--cpus", "0-1", period=PERIOD)
    path = layouts.make(template, cpus="1")  # the scheduler gave this job CPU 1 only
    job, job_id = _job_in(controller, layouts, path, layout, "import os, time; os.fork(); time.sleep(120)")
    processes = _tree(job, at_least=3)
    nested = f"{path}/{controller.group}/{job_id}"
    for process in processes:
        paths = cgroups_of(process.pid)
        for hierarchy in ALL:
            assert paths[hierarchy] == (nested if hierarchy in MANAGED else path), (process.cmdline(), hierarchy)
        assert set(process.cpu_affinity()) <= {1}, process.cmdline()
    cpuset = CGROUP_ROOT / "cpuset" / nested.lstrip("/") / "cpuset.cpus"
    wait_until(lambda: cpuset.read_text().strip() == "1", 10, "the job's cpuset: the managed CPUs within the scheduler's")
    snapshot = controller.job(job_id)
    assert snapshot is not None and snapshot.cgroup == str(CGROUP_ROOT / "cpu" / nested.lstrip("/"))
    assert (snapshot.scheduler, snapshot.cgroups) == (scheduler, {h: nested for h in MANAGED})
    table = subprocess.run([sys.executable, "-m", "adloader", "status", "--socket", str(controller.socket)],
                           capture_output=True, text=True, timeout=30, cwd=REPO, env=controller.environ)
    assert f"@ {layout} ({job_id}) scheduler {scheduler}, CPU limit 1.00 cores: blkio,cpu,cpuacct,cpuset={nested}" \
        in table.stdout, "its cpuset's one CPU is its limit"

    pids = [p.pid for p in processes]
    layouts.kill(path)
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids),
               10, "the scheduler's kill to end every process")
    gone_at = time.monotonic()
    groups = [CGROUP_ROOT / h / nested.lstrip("/") for h in MANAGED]
    wait_until(lambda: not any(g.exists() for g in groups), 10, "adloader's groups to go")
    assert time.monotonic() - gone_at <= 2 * PERIOD + 0.25, "gone within two control periods"
    assert not any((CGROUP_ROOT / h / path.lstrip("/") / controller.group).exists() for h in MANAGED)
    # the scheduler can now remove its own cgroups (kubelet and systemd rmdir them, as here)
    for hierarchy in ALL:
        (CGROUP_ROOT / hierarchy / path.lstrip("/")).rmdir()


@pytest.mark.parametrize("policy", ["even", "adaptive"])
def test_two_busy_jobs_under_different_parents_get_the_cpu_the_plan_gives_them(
    start_controller: Callable[..., ControllerProcess], layouts: Layouts, policy: str
) -> None:
    """CPU weights act only between siblings; these two pods are not, so the plan must be
    enforced by quotas: each job's CPU use follows its planned cores within 0.2 core (as the
    managed-path tests)."""
    controller = start_controller("--policy", policy, "--cpus", "0", period=PERIOD)
    paths = [layouts.make(LAYOUTS["kubelet-cgroupfs"][1], cpus="0-1") for _ in range(2)]
    jobs = [_job_in(controller, layouts, path, f"pod-{i}", BUSY) for i, path in enumerate(paths)]
    for (job, _), path in zip(jobs, paths):
        _tree(job, at_least=3)
    ids = [job_id for _, job_id in jobs]

    def planned() -> list[float] | None:
        snapshots = [controller.job(job_id) for job_id in ids]
        if any(s is None or s.cores is None for s in snapshots):
            return None
        return [s.cores for s in snapshots]  # type: ignore[union-attr]

    cores = wait_until(planned, 10, "a plan in cores (quotas) for both jobs")
    assert all(controller.job(job_id).cpu_weight is None for job_id in ids), "weights would not act across parents"
    assert abs(sum(cores) - 1.0) < 0.05, cores
    nested = [f"{path}/{controller.group}/{job_id}" for path, job_id in zip(paths, ids)]
    for n, c in zip(nested, cores):
        quota = int((CGROUP_ROOT / "cpu" / n.lstrip("/") / "cpu.cfs_quota_us").read_text())
        assert quota == round(c * 100_000)
    # Other test runs share this machine: weight both pods' top far above them, so that the
    # quotas, the thing under test, bound each job.
    write_interface(CGROUP_ROOT / "cpu" / layouts.top / "cpu.shares", "262144", "test setup")
    cpuacct = [CGROUP_ROOT / "cpuacct" / n.lstrip("/") for n in nested]
    before, start = _usage(cpuacct), time.monotonic()
    time.sleep(3.0)
    after, elapsed = _usage(cpuacct), time.monotonic() - start
    got = [(a - b) / 1e9 / elapsed for a, b in zip(after, before)]
    print(f"{policy}: planned cores {cores}, used {[round(g, 3) for g in got]} core-s/s over {elapsed:.1f} s")
    assert all(abs(g - c) <= 0.2 for g, c in zip(got, cores)), (got, cores)


def test_after_sigterm_no_group_remains_for_a_job_that_ended(
    start_controller: Callable[..., ControllerProcess], layouts: Layouts
) -> None:
    """A job that ends during a long control period: SIGTERM then removes its group at once,
    while a job still running keeps its group (its limits lifted)."""
    controller = start_controller("--policy", "even", "--cpus", "0", period=30.0)
    path = layouts.make(LAYOUTS["systemd-service"][1], cpus="0-1")
    short, _ = _job_in(controller, layouts, path, "short", "import time; time.sleep(1)")
    long_path = layouts.make(LAYOUTS["systemd-service"][1], cpus="0-1")
    _, long_id = _job_in(controller, layouts, long_path, "long", "import time; time.sleep(120)")
    assert short.wait(20) == 0
    assert controller.stop(signal.SIGTERM) == 0
    for hierarchy in MANAGED:
        assert not (CGROUP_ROOT / hierarchy / path.lstrip("/") / controller.group).exists(), hierarchy
        assert (CGROUP_ROOT / hierarchy / long_path.lstrip("/") / controller.group / long_id).is_dir(), hierarchy


def test_after_kill_9_a_restarted_controller_adopts_a_nested_job_where_it_is(
    start_controller: Callable[..., ControllerProcess], layouts: Layouts
) -> None:
    controller = start_controller("--policy", "even", "--cpus", "0", period=PERIOD)
    path = layouts.make(LAYOUTS["kubelet-systemd"][1], cpus="0-1")
    job, job_id = _job_in(controller, layouts, path, "adopted", "import time; time.sleep(120)")
    quota = CGROUP_ROOT / "cpu" / path.lstrip("/") / controller.group / job_id / "cpu.cfs_quota_us"
    wait_until(lambda: quota.read_text().strip() == "100000", 10, "the job's quota")
    controller.kill()
    quota.write_text("-1")  # the limit is lost
    controller.start()
    wait_until(lambda: quota.read_text().strip() == "100000", 10, "the adopted job's quota restored in place")
    assert [j.job_id for j in controller.status().jobs] == [job_id]
    assert not (CGROUP_ROOT / "cpu" / controller.group / job_id).exists(), "no second group at the root"
    assert cgroups_of(job.pid)["cpu"] == f"{path}/{controller.group}/{job_id}"


def test_a_pods_cpu_limit_is_planned_within_and_logged_once(
    start_controller: Callable[..., ControllerProcess], layouts: Layouts
) -> None:
    """kubelet's cgroupfs driver sets a pod's CPU limit as the pod cgroup's CFS quota: the
    controller reads it above the job's group, says so once at INFO, and the placeholder of a
    job it has not measured yet is planned within it, not half of the node's two cores (two
    pods: weights do not act across parents, so the plan is enforced by quotas)."""
    controller = start_controller("--policy", "adaptive", "--cpus", "0-1", period=PERIOD)
    path = layouts.make(LAYOUTS["kubelet-cgroupfs"][1], cpus="0-1")
    pod = CGROUP_ROOT / "cpu" / path.lstrip("/").rsplit("/", 1)[0]
    (pod / "cpu.cfs_quota_us").write_text("25000")  # a quarter of a CPU per 100 ms: limits.cpu 250m
    _, job_id = _job_in(controller, layouts, path, "limited", "import time; time.sleep(120)")
    other = layouts.make(LAYOUTS["kubelet-cgroupfs"][1], cpus="0-1")
    _, other_id = _job_in(controller, layouts, other, "free", "import time; time.sleep(120)")
    said = f"job {job_id} (limited): its scheduler lets it use at most 0.25 cores"
    wait_until(lambda: said in controller.log_path.read_text(), 20, "the limit logged")

    def quota(at: str, job: str) -> int:
        return int((CGROUP_ROOT / "cpu" / at.lstrip("/") / controller.group / job / "cpu.cfs_quota_us").read_text())

    wait_until(lambda: quota(path, job_id) == 25_000 and quota(other, other_id) >= 100_000, 20,
               "the limited job's placeholder within its 0.25 cores, the other job given the rest")
    assert controller.log_path.read_text().count(said) == 1
    assert {job.job_id: job.scheduler_cpu_limit for job in controller.status().jobs}[job_id] == 0.25


def test_a_cpuset_the_scheduler_widens_is_seen_within_the_placement_refresh(layouts: Layouts) -> None:
    """placement() is asked for several times a job per step: what the scheduler set on the
    job's parent is read again only after PLACEMENT_REFRESH_S (kubelet's CPU manager changes a
    shared pool's cpuset on its own 10 s reconcile)."""
    from controller.backends.cgroup_v1 import CgroupV1Backend
    from controller.backends.cgroupfs import PLACEMENT_REFRESH_S

    path = layouts.make(LAYOUTS["kubelet-cgroupfs"][1], cpus="0")
    sleeper = subprocess.Popen(layouts.command(path, sys.executable, "-c", "import time; time.sleep(60)"))
    clock = [0.0]
    backend = CgroupV1Backend(group=f"{layouts.top}-ours", root=CGROUP_ROOT, clock=lambda: clock[0])
    try:
        wait_until(lambda: cgroups_of(sleeper.pid).get("cpuset") == path, 10, "the process in the scheduler's cpuset")
        backend.create("job-a", near_pid=sleeper.pid)
        assert backend.placement("job-a").allowed_cpus == (0,)
        directory = CGROUP_ROOT / "cpuset"
        for part in path.strip("/").split("/"):  # widened from the top: a child never holds more than its parent
            directory = directory / part
            (directory / "cpuset.cpus").write_text("0-1")
        clock[0] += PLACEMENT_REFRESH_S / 2
        assert backend.placement("job-a").allowed_cpus == (0,)  # read half a refresh ago: kept
        clock[0] += PLACEMENT_REFRESH_S
        assert backend.placement("job-a").allowed_cpus == (0, 1)
    finally:
        sleeper.kill()
        sleeper.wait()
        backend.remove("job-a")
