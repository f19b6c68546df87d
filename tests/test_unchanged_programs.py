"""Four training programs nobody wrote for adloader (tests/programs/), started unchanged with
plain ``adloader run --``: a Hugging Face ``Trainer`` (a small BERT from a config), an Accelerate
loop, Lightning DDP (2 processes over gloo; Lightning starts rank 1 as a child of rank 0) and a
``torchrun --nproc-per-node 2`` DDP script over real JPEG files. None imports adloader.

Each test runs its program under a real controller (the ``even`` policy over this node's CPUs)
and shows that:
- the job reports from every rank, and what each rank iterated is adloader's loader (for HF and
  Accelerate the loader inside Accelerate's ``DataLoaderShard``);
- its workers follow a lower and then a higher target, live: a second job arriving halves the
  job's share of the node, so its worker target (even: workers follow cores) falls, and its
  leaving restores it. The loaders' running workers, as the controller sees them, reach each;
- every sample is delivered exactly once per epoch: over the ranks, each epoch's indices are
  ``range(N)`` with no duplicate;
- each step's loss is exactly that of the same program run plainly (python or torchrun, no
  adloader), and so are the samples of each step: the plain run goes on beside the managed one.

A 2-rank job on a node of fewer than 3 CPUs gets one worker per rank from ``even`` alone and
beside another job alike (below the 2 its program asks for), so there no target can rise: the
test then checks the rest, and skips at its end, saying so.
"""
from __future__ import annotations

import importlib.util
import math
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from adloader.cpuspec import format_cpus, online_cpus
from bench.controller_process import REPO, ControllerProcess, HarnessError, kill_session, wait_until
from bench.unchanged_programs import (OURS, PROGRAMS, TORCHS, Program, Size, command, environment, jpeg_folder,
                                     read_records)

SIZE = Size(samples=128, epochs=2, batch_size=8, num_workers=2, px=32)
"""Each run: 128 samples an epoch, 8 a batch; the plain run trains 2 epochs, the managed one
until the test stops it (at least 2). The programs ask for 2 workers per rank."""
PHASE_S = 120.0
"""Seconds a phase may take (a framework's start-up on 2 busy cores included)."""


def program_param(name: str) -> Any:
    program = PROGRAMS[name]
    missing = importlib.util.find_spec(program.framework) is None
    return pytest.param(program, id=name, marks=[pytest.mark.slow, pytest.mark.skipif(
        missing, reason=f"{program.framework} is not installed (./install.sh --test installs it)")])


def even_workers(cores: float, jobs: int, ranks: int) -> int:
    """Workers per rank the even policy gives one of ``jobs`` jobs: workers follow cores."""
    return max(1, math.ceil(cores / jobs / ranks - 1e-9))


def running(controller: ControllerProcess, job_id: str, workers: int, ranks: int) -> Callable[[], bool]:
    """Whether the job's target is ``workers`` a rank and its loaders run that many, all ranks."""
    def check() -> bool:
        snap = controller.job(job_id)
        return bool(snap and snap.workers_target == workers * ranks and snap.workers_running == workers * ranks)
    return check


def start_plain(program: Program, out: Path, data: Path | None, log: Path) -> subprocess.Popen:
    """The same program run as its user would without adloader, in a session of its own."""
    with log.open("w") as stderr:
        return subprocess.Popen(command(program, out, SIZE, data), env=environment(), cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)


@pytest.mark.parametrize("program", [program_param(name) for name in PROGRAMS])
def test_an_unchanged_program_is_managed_follows_targets_and_trains_as_without_adloader(
        program: Program, start_controller: Callable[..., ControllerProcess], tmp_path: Path) -> None:
    data = jpeg_folder(tmp_path / "jpeg", SIZE) if program.images else None
    plain = start_plain(program, tmp_path / "plain", data, tmp_path / "plain.err")
    try:
        managed = train_managed(program, start_controller, tmp_path, data)
        assert plain.wait(PHASE_S) == 0, (tmp_path / "plain.err").read_text()[-3000:]
    finally:
        kill_session(plain)
    baseline = read_records(tmp_path / "plain", program.ranks)
    assert len({r["pid"] for r in managed}) == program.ranks
    for rank, (ours, theirs) in enumerate(zip(managed, baseline)):
        assert ours["loader_class"] == OURS, f"rank {rank} of {program.name} iterated {ours['loader_class']}"
        assert theirs["loader_class"] == TORCHS, f"the plain run of {program.name} iterated {theirs['loader_class']}"
        assert len(ours["epochs"]) >= SIZE.epochs and len(theirs["epochs"]) == SIZE.epochs
        assert ours["epochs"][:SIZE.epochs] == theirs["epochs"], f"rank {rank} trained on other samples than plainly"
        assert ours["losses"][:len(theirs["losses"])] == theirs["losses"], f"rank {rank}'s losses differ from plain"
    for epoch in range(min(len(r["epochs"]) for r in managed)):
        delivered = sorted(i for r in managed for i in r["epochs"][epoch])
        assert delivered == list(range(SIZE.samples)), f"epoch {epoch}: not every sample exactly once"
    alone, shared = targets(program)
    if alone == shared:
        pytest.skip(f"checked all but a raised target: its workers followed the target of {alone} a rank (below "
                    f"the {SIZE.num_workers} it asks for), but a {program.ranks}-rank job gets {alone} a rank from the "
                    f"even policy alone and beside another job alike on a node of {len(online_cpus())} CPUs "
                    "(it takes 3)")


def targets(program: Program) -> tuple[int, int]:
    """Workers per rank the even policy gives the program's job alone, and beside a second job."""
    cores = len(online_cpus())
    return even_workers(cores, 1, program.ranks), even_workers(cores, 2, program.ranks)


def train_managed(program: Program, start_controller: Callable[..., ControllerProcess], tmp_path: Path,
                  data: Path | None) -> list[dict[str, Any]]:
    """Run the program under ``adloader run`` through the phases (alone, beside a second job, alone
    again) until it has trained SIZE.epochs epochs; its records."""
    controller = start_controller("--policy", "even", "--cpus", format_cpus(online_cpus()))
    stop = tmp_path / "stop"
    job = controller.run(*command(program, tmp_path / "managed", replace(SIZE, epochs=1000), data, stop_file=stop),
                         name=program.name, environ=environment())
    job_id = controller.registered(job, 60).job_id
    alone, shared = targets(program)

    def phase(predicate: Callable[[], object], what: str) -> None:
        try:
            wait_until(predicate, PHASE_S, what)
        except HarnessError as error:
            raise HarnessError(f"{error}\nlauncher output: {job.output()}\ncontroller log:\n{controller.log()[-4000:]}")

    phase(lambda: (s := controller.job(job_id)) and s.state == "running" and s.ranks_reporting == program.ranks,
          f"{program.ranks} rank(s) of {program.name} to report")
    phase(running(controller, job_id, alone, program.ranks), f"{alone} worker(s) a rank alone")
    if shared < alone:
        other = controller.run(sys.executable, "-c", "import time; time.sleep(600)", name="second-job")
        controller.registered(other)
        phase(running(controller, job_id, shared, program.ranks), f"{shared} worker(s) a rank beside a second job")
        other.signal(signal.SIGTERM)
        other.wait(30)
        phase(running(controller, job_id, alone, program.ranks), f"{alone} worker(s) a rank once the second job left")
    phase(lambda: controller.job(job_id).samples_total >= SIZE.epochs * SIZE.samples, f"{SIZE.epochs} epochs trained")
    stop.touch()
    assert job.wait(PHASE_S) == 0, job.output()
    return read_records(tmp_path / "managed", program.ranks)
