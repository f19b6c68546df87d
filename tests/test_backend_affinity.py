"""The unprivileged fallback on real processes: affinity of a whole tree, CPU time, and no root needed."""
from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from controller.backends.affinity import AffinityBackend
from controller.backends.base import BackendError
from fixtures.processes import FORK_ON_GO, SLEEP, Children, children, fork_after_go, run_forked_as_nobody  # noqa: F401

ALL_CPUS = sorted(os.sched_getaffinity(0))

needs_two_cpus = pytest.mark.skipif(len(ALL_CPUS) < 2, reason="confining to one CPU shows nothing on a 1-CPU machine")
needs_root_to_drop = pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid nobody for the test needs root")


def test_capabilities_are_cpuset_and_accounting_only() -> None:
    backend = AffinityBackend()
    assert backend.capabilities == {"cpuset", "cpu_accounting"}
    backend.create("job-a")
    backend.set_cpu_quota("job-a", 0.5)  # accepted and ignored: not a capability
    backend.set_read_bps("job-a", "254:0", 1)
    assert backend.existing_jobs() == []


@needs_two_cpus
def test_cpuset_confines_the_tree_and_children_born_later(children: Children) -> None:
    backend = AffinityBackend()
    assert backend.create("job-a") == "affinity:job-a"
    parent = children.start(FORK_ON_GO)
    backend.attach("job-a", parent.pid)
    backend.set_cpuset("job-a", (ALL_CPUS[-1],))
    child = fork_after_go(parent)
    assert backend.pids("job-a") == {parent.pid, child}
    assert psutil.Process(parent.pid).cpu_affinity() == [ALL_CPUS[-1]]
    assert psutil.Process(child).cpu_affinity() == [ALL_CPUS[-1]]
    assert backend.job_of(child) == "job-a"
    assert backend.job_of(os.getpid()) is None

    late = children.start(SLEEP)  # attached after the cpuset was chosen: gets it on attach
    backend.attach("job-a", late.pid)
    assert psutil.Process(late.pid).cpu_affinity() == [ALL_CPUS[-1]]

    backend.release("job-a")
    assert psutil.Process(child).cpu_affinity() == ALL_CPUS
    backend.set_cpuset("job-a", (ALL_CPUS[0],))
    backend.remove("job-a")
    assert psutil.Process(child).cpu_affinity() == ALL_CPUS
    assert backend.pids("job-a") == set()


def test_cpu_seconds_counts_the_tree_including_reaped_children(children: Children) -> None:
    backend = AffinityBackend()
    backend.create("job-a")
    # Burns 0.3 s of CPU in a grandchild that exits and is reaped by its parent, which then sleeps.
    parent = children.start(
        "import os, sys, time\n"
        "sys.stdin.readline()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    while time.process_time() < 0.3: pass\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('done', flush=True)\n"
        "time.sleep(60)\n"
    )
    backend.attach("job-a", parent.pid)
    parent.stdin.write("go\n")
    parent.stdin.flush()
    assert parent.stdout.readline().strip() == "done"
    assert backend.cpu_seconds("job-a") >= 0.3


def test_errors_say_what_to_do(children: Children) -> None:
    backend = AffinityBackend()
    with pytest.raises(BackendError, match="create it first"):
        backend.set_cpuset("job-a", (0,))
    backend.create("job-a")
    exited = children.start("pass")
    exited.wait()
    with pytest.raises(BackendError, match="already exited"):
        backend.attach("job-a", exited.pid)
    with pytest.raises(BackendError, match="at least one CPU"):
        backend.set_cpuset("job-a", ())


@needs_two_cpus
@needs_root_to_drop
def test_works_without_root() -> None:
    def confine_a_sleep_as_nobody() -> dict:
        backend = AffinityBackend()
        backend.create("job-a")
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            backend.attach("job-a", sleeper.pid)
            backend.set_cpuset("job-a", (ALL_CPUS[-1],))
            return {"uid": os.getuid(), "affinity": psutil.Process(sleeper.pid).cpu_affinity()}
        finally:
            sleeper.kill()
            sleeper.wait()

    assert run_forked_as_nobody(confine_a_sleep_as_nobody) == {"uid": 65534, "affinity": [ALL_CPUS[-1]]}


@needs_two_cpus
@needs_root_to_drop
def test_another_users_process_is_refused_with_a_remedy(children: Children) -> None:
    root_owned = children.start(SLEEP)

    def confine_roots_process() -> str:
        backend = AffinityBackend()
        backend.create("job-a")
        backend.attach("job-a", root_owned.pid)
        try:
            backend.set_cpuset("job-a", (ALL_CPUS[-1],))
        except BackendError as exc:
            return str(exc)
        return "no error"

    assert "belongs to another user" in run_forked_as_nobody(confine_roots_process)
