"""A job none of whose loaders reports is never silently unmanaged: a real controller calls it
unmanaged after its grace period, with the reason, in status; its launcher warns once in the
job's own output; a job whose loaders report stays running and is never warned."""
from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from adloader.status import COLUMNS, render_table
from bench.controller_process import ControllerProcess, poll, wait_until
from controller.unmanaged import NEVER_REPORTED

REPO = Path(__file__).resolve().parent.parent
REPORTING_JOB = (sys.executable, str(REPO / "tests" / "reporting_job.py"), "--seconds", "60")
SILENT_JOB = (sys.executable, "-c", "import time; time.sleep(60)")
"""A job whose data loading is not a DataLoader: it never reports."""
FALLBACK = "loader fell back to torch's (in_order=False)"
GRACE_S = 4.0
"""Long enough that the three jobs' registrations are read within it on a loaded 2-core CI machine
(at 1.5 s the silent job was once unmanaged before its registration was read)."""


def _row(table: str, job_id: str) -> list[str]:
    line = next(line for line in table.splitlines() if f"  {job_id}  " in line)
    cells = re.split(r"\s{2,}", line.strip())
    assert len(cells) == len(COLUMNS), line
    return cells


def test_a_job_that_never_reports_is_unmanaged_after_the_grace_and_its_launcher_says_why_once(
    start_controller: Callable[..., ControllerProcess],
) -> None:
    controller = start_controller("--policy", "even", "--cpus", "0", "--unmanaged-after", str(GRACE_S))
    silent = controller.run(*SILENT_JOB, name="get-batch", options=("--gpus", "0"))
    fallback = controller.run(*REPORTING_JOB, "--unmanaged-reason", FALLBACK, name="fallback")
    managed = controller.run(*REPORTING_JOB, name="managed")
    registered = {job.name: controller.registered(job) for job in (silent, fallback, managed)}
    silent_id = registered["get-batch"].job_id
    assert registered["get-batch"].state == "starting"  # within the grace: not yet called unmanaged

    def settled() -> dict[str, str] | None:
        states = {job.name: job.state for job in controller.status().jobs}
        return states if states == {"get-batch": "unmanaged", "fallback": "unmanaged", "managed": "running"} else None
    wait_until(settled, 20, "the silent and fallback jobs unmanaged, the reporting one running")
    assert time.time() - registered["get-batch"].registered_at >= GRACE_S

    node = controller.status()
    jobs = {job.name: job for job in node.jobs}
    assert jobs["get-batch"].unmanaged_reason == NEVER_REPORTED.format(grace=GRACE_S)
    assert jobs["fallback"].unmanaged_reason == FALLBACK
    assert jobs["managed"].unmanaged_reason is None
    assert jobs["fallback"].workers_target is None and jobs["fallback"].samples_total == 0  # not a loader's counters

    table = render_table(node, time.time())
    row = dict(zip(COLUMNS, _row(table, silent_id)))
    assert (row["STATE"], row["GPUS"], row["GPU IDLE"], row["WORKERS"]) == ("unmanaged", "-", "-", "-")
    assert f"! get-batch ({silent_id}): unmanaged: no loader has reported in {GRACE_S:g} s" in table
    assert f"unmanaged: {FALLBACK}." in table
    assert dict(zip(COLUMNS, _row(table, jobs["managed"].job_id)))["STATE"] == "running"
    assert controller.log().count(f"job {silent_id} (get-batch) is unmanaged: no loader has reported in {GRACE_S:g} s") == 1

    def warned(job) -> list[str]:
        return [line for line in job.output()[1].splitlines() if "is unmanaged" in line]
    wait_until(lambda: warned(silent) and warned(fallback), 10, "the launchers' warnings")
    time.sleep(2.5)  # a launcher asks every 2 s: a second warning would be out by now
    (line,) = warned(silent)
    assert line.startswith("adloader run: warning: job get-batch") and f"no loader has reported in {GRACE_S:g} s" in line
    (line,) = warned(fallback)
    assert FALLBACK in line
    assert warned(managed) == []


def test_a_torch_loader_that_falls_back_under_the_substitution_tells_status_why(
    start_controller: Callable[..., ControllerProcess], tmp_path: Path,
) -> None:
    """An unchanged program whose loader adloader cannot run (in_order=False) runs it as torch's;
    its rank still reports, so status names that reason, not "no loader has reported"."""
    controller = start_controller("--policy", "even", "--cpus", "0", "--unmanaged-after", "60")
    job = controller.run(sys.executable, str(REPO / "tests" / "plain_torch_job.py"), "--unordered",
                         "--out", str(tmp_path / "out.json"), "--stop-file", str(tmp_path / "stop"), name="unordered")
    job_id = controller.registered(job).job_id
    snap = wait_until(lambda: (s := controller.job(job_id)) and s.state == "unmanaged" and s, 60,
                      f"the fallback's reason in status; log:\n{controller.log()}")
    assert "in_order=False" in snap.unmanaged_reason, snap.unmanaged_reason
    (tmp_path / "stop").touch()
    assert job.wait(60) == 0, job.output()
    assert "TorchLoaderFallback" in job.output()[1]


BUSY_TENTH = (sys.executable, "-c", "import time\nwhile True:\n    t = time.monotonic()\n"
              "    while time.monotonic() - t < 0.01: pass\n    time.sleep(0.09)")
"""A job that computes about a tenth of a core and never reports (its loading is its own)."""


def test_adaptive_holds_an_unmanaged_job_what_its_group_uses_not_an_even_share(
    start_controller: Callable[..., ControllerProcess],
) -> None:
    controller = start_controller("--policy", "adaptive", "--cpus", "0", "--unmanaged-after", "1")
    silent = controller.registered(controller.run(*BUSY_TENTH, name="own-loop"))
    controller.registered(controller.run(*REPORTING_JOB, name="managed"))

    seen: list[tuple[float, int]] = []

    def held_what_it_uses() -> object:
        """Its group's use measured (under 0.3 cores once its start-up has left the window: on a loaded
        2-core machine the first window, with the interpreter starting, read 0.43) and its weight
        under 40: an even share of the one core would be 50; what it uses, with the plan's margin,
        is well under it."""
        job = controller.job(silent.job_id)
        if job is None or job.state != "unmanaged" or not job.cores_used or not job.cpu_weight:
            return None
        seen.append((job.cores_used, job.cpu_weight))
        return job if job.cores_used < 0.3 and job.cpu_weight < 40 else None
    held = poll(held_what_it_uses, 30)
    assert held is not None, f"never held what it uses; (cores used, weight), last seen: {seen[-5:]}"


def test_a_launcher_asking_about_its_starting_job_still_forwards_a_signal_at_once(
    start_controller: Callable[..., ControllerProcess], tmp_path: Path,
) -> None:
    """While the job is starting the launcher waits with a timeout between its questions; a
    signal that arrives meanwhile is forwarded when it arrives, not at the next question."""
    controller = start_controller("--policy", "even", "--cpus", "0", "--unmanaged-after", "60")
    ready = tmp_path / "ready"
    job = controller.run(sys.executable, "-c", "import pathlib, sys, time\npathlib.Path(sys.argv[1]).touch()\n"
                         "time.sleep(60)", str(ready), name="starting")
    wait_until(ready.exists, 20, "the command to start")
    time.sleep(2.3)  # past the launcher's first question: it is between two of them now
    sent = time.monotonic()
    job.signal(signal.SIGTERM)
    assert job.wait(20) == 128 + signal.SIGTERM
    assert time.monotonic() - sent < 1.0
    assert "is unmanaged" not in job.output()[1]
