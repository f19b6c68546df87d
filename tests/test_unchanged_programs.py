"""Four training programs nobody wrote for adloader (tests/programs/), started unchanged with
plain ``adloader run --``: a Hugging Face ``Trainer`` (a small BERT from a config), an Accelerate
loop, Lightning DDP (2 processes over gloo; Lightning starts rank 1 as a child of rank 0) and a
``torchrun --nproc-per-node 2`` DDP script over real JPEG files. None imports adloader.

Each test runs its program under a real controller (the ``even`` policy over this node's CPUs)
and shows that:
- the job reports from every rank, and what each rank iterated is adloader's loader (for HF and
  Accelerate the loader inside Accelerate's ``DataLoaderShard``);
- its workers follow a lower and then a higher target, live: an operator pins the job's workers
  (``adloader workers JOB N``, the CLI) to 1 a rank, then to 3 a rank, then gives them back to the
  policy (``auto``). The loaders' running workers, as the controller sees them, reach each;
- its model is described from its first optimizer step (it gets a predicted max throughput);
- every sample is delivered exactly once per epoch: over the ranks, each epoch's indices are
  ``range(N)`` with no duplicate;
- each step's loss is exactly that of the same program run plainly (python or torchrun, no
  adloader), and so are the samples of each step: the plain run goes on beside the managed one.

The pins make the targets explicit: on a node of 2 CPUs the ``even`` policy alone would give a
2-rank job one worker a rank whatever else runs, so no policy-made target could rise there.
"""
from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from adloader.cpuspec import format_cpus, online_cpus
from bench.controller_process import REPO, ControllerProcess, HarnessError, base_environment, kill_session, wait_until
from bench.unchanged_programs import (OURS, PROGRAMS, TORCHS, Program, Size, command, environment, jpeg_folder,
                                     read_records)

SIZE = Size(samples=512, epochs=2, batch_size=8, num_workers=2, px=32)
"""Each run: 512 samples an epoch, 8 a batch; the plain run trains 2 epochs, the managed one
until the test stops it (at least 2). The programs ask for 2 workers per rank. Their workers are
not persistent, so each epoch starts them anew: at 128 samples a Lightning epoch on 2 busy cores
ended before its 3 workers a rank were all up, and no report ever showed them running."""
PHASE_S = 120.0
"""Seconds a phase may take (a framework's start-up on 2 busy cores included)."""
LOWER, HIGHER = 1, 3
"""Workers a rank the job is pinned to, one after the other (its program asks for 2)."""


def program_param(name: str) -> Any:
    program = PROGRAMS[name]
    missing = importlib.util.find_spec(program.framework) is None
    return pytest.param(program, id=name, marks=[pytest.mark.slow, pytest.mark.skipif(
        missing, reason=f"{program.framework} is not installed (./install.sh --test installs it)")])


def even_workers(cores: float, ranks: int) -> int:
    """Workers per rank the even policy gives a job alone on the node: workers follow cores."""
    return max(1, math.ceil(cores / ranks - 1e-9))


def running(controller: ControllerProcess, job_id: str, workers: int, ranks: int,
            pinned: int | None) -> Callable[[], bool]:
    """Whether the job's target is ``workers`` a rank, pinned to ``pinned`` (None: the policy's), and its
    loaders run that many, all ranks."""
    def check() -> bool:
        snap = controller.job(job_id)
        return bool(snap and snap.workers_pinned == pinned and snap.workers_target == workers * ranks
                    and snap.workers_running == workers * ranks)
    return check


def pin_workers(controller: ControllerProcess, job_id: str, workers: str) -> None:
    """``adloader workers JOB N|auto``, as an operator types it."""
    result = subprocess.run([sys.executable, "-m", "adloader", "workers", job_id, workers, "--socket",
                             str(controller.socket)], capture_output=True, text=True, timeout=60, cwd=REPO,
                            env=base_environment())
    assert result.returncode == 0 and job_id in result.stdout, result.stderr


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


def train_managed(program: Program, start_controller: Callable[..., ControllerProcess], tmp_path: Path,
                  data: Path | None) -> list[dict[str, Any]]:
    """Run the program under ``adloader run`` through the phases (the policy's workers, pinned lower,
    pinned higher, the policy's again) until it has trained SIZE.epochs epochs; its records."""
    controller = start_controller("--policy", "even", "--cpus", format_cpus(online_cpus()))
    stop = tmp_path / "stop"
    job = controller.run(*command(program, tmp_path / "managed", replace(SIZE, epochs=1000), data, stop_file=stop),
                         name=program.name, environ=environment())
    job_id = controller.registered(job, 60).job_id
    ranks, policy = program.ranks, even_workers(len(online_cpus()), program.ranks)

    def phase(predicate: Callable[[], object], what: str) -> None:
        try:
            wait_until(predicate, PHASE_S, what)
        except HarnessError as error:
            snap = controller.job(job_id)
            seen = snap and (f"pinned {snap.workers_pinned}, target {snap.workers_target}, running "
                             f"{snap.workers_running}, samples {snap.samples_total}, state {snap.state}")
            said = "\n".join(line for line in controller.log().splitlines() if " DEBUG " not in line)
            raise HarnessError(f"{error}\nthe job: {seen}\nlauncher output: {job.output()}\n"
                               f"controller log (no DEBUG):\n{said[-6000:]}")

    phase(lambda: (s := controller.job(job_id)) and s.state == "running" and s.ranks_reporting == program.ranks,
          f"{program.ranks} rank(s) of {program.name} to report")
    phase(running(controller, job_id, policy, ranks, None), f"the even policy's {policy} worker(s) a rank")
    for workers in (LOWER, HIGHER):
        pin_workers(controller, job_id, str(workers * ranks))
        phase(running(controller, job_id, workers, ranks, workers * ranks), f"{workers} worker(s) a rank, pinned")
    pin_workers(controller, job_id, "auto")
    phase(running(controller, job_id, policy, ranks, None), f"the policy's {policy} worker(s) a rank again")
    phase(lambda: controller.job(job_id).samples_total >= SIZE.epochs * SIZE.samples, f"{SIZE.epochs} epochs trained")
    said = job.output()[1]
    assert controller.job(job_id).max_sps_predicted is not None and "measured only" not in said \
        and "could not count" not in said, f"{program.name} was not described from its first step: {said[-3000:]}"
    stop.touch()
    assert job.wait(PHASE_S) == 0, job.output()
    return read_records(tmp_path / "managed", program.ranks)
