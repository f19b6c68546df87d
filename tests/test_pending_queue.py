"""The pending queue the controller watches for ``jct`` (controller/pending_queue.py): Slurm's
``squeue`` output parsed, partitions found with ``sinfo``, a queue file, and the refresh and
staleness rules. The real Slurm end of it runs in tests/test_slurm.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pytest

from controller.pending_queue import (
    FileQueue, PendingQueue, PendingQueueError, SlurmQueue, gpus_of_gres, parse_squeue, queue_source, run_command,
)
from controller.policies.pending import PendingJob


@pytest.mark.parametrize("gres, gpus", [
    ("gres:gpu:4", 4), ("gpu:4", 4), ("gres:gpu:a100:2", 2), ("gres/gpu:1,gres/shard:2", 1),
    ("gpu:a100:2(IDX:0-1)", 2), ("N/A", 0), ("(null)", 0), ("", 0), ("gres:gpu:2,gres:gpu:tesla:1", 3),
])
def test_gpus_are_read_from_the_generic_resources_slurm_prints(gres: str, gpus: int) -> None:
    assert gpus_of_gres(gres) == gpus


def test_squeue_lines_give_pending_jobs_and_skip_what_is_not_a_job() -> None:
    text = ("1234|gres:gpu:4|gpu|train resnet|nightly\n"
            "slurm_load_jobs warning: something\n"
            "1235_7|N/A|gpu|\n"
            "  1236|gpu:1|gpu|bert  \n")
    assert parse_squeue(text) == (PendingJob("train resnet|nightly", 4), PendingJob("1235_7", 0),
                                  PendingJob("bert", 1))


class Commands:
    """Slurm's answers, as the runner seam gives them (the real commands: tests/test_slurm.py)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        return self.answers[argv[0]]


def test_slurm_queue_watches_the_partitions_this_node_is_in() -> None:
    commands = Commands({"sinfo": "gpu\ndebug\ngpu\n", "squeue": "77|gres:gpu:8|gpu|big\n"})
    assert SlurmQueue(node="n1", runner=commands).read() == (PendingJob("big", 8),)
    assert commands.calls[0] == ["sinfo", "--noheader", "--nodes=n1", "--format=%R"]
    assert "--partition=debug,gpu" in commands.calls[1] and "--states=PENDING" in commands.calls[1]
    named = Commands({"squeue": ""})
    assert queue_source("slurm:a,b", runner=named).read() == ()
    assert named.calls == [["squeue", "--noheader", "--states=PENDING", "--partition=a,b", "--format=%i|%b|%P|%j"]]


def test_a_node_in_no_partition_says_to_name_them() -> None:
    with pytest.raises(PendingQueueError, match="--pending slurm:PARTITION"):
        SlurmQueue(node="n1", runner=Commands({"sinfo": "\n"})).read()


def test_a_missing_squeue_says_what_to_do() -> None:
    with pytest.raises(PendingQueueError, match="install Slurm's client commands"):
        run_command(["adloader-no-such-squeue", "--noheader"])


def test_a_failing_command_says_how() -> None:
    with pytest.raises(PendingQueueError, match=r"failed \(3\)"):
        run_command(["sh", "-c", "echo no controller >&2; exit 3"])


def test_the_queue_is_read_at_most_every_refresh_and_unknown_once_stale(tmp_path: Path) -> None:
    path = tmp_path / "pending.json"
    now = [0.0]
    queue = PendingQueue(FileQueue(path), refresh_s=5.0, stale_s=30.0, clock=lambda: now[0])
    assert queue.current() is None  # no file yet: unknown, not empty
    path.write_text(json.dumps({"jobs": [{"name": "w", "gpus": 2, "samples": 640}]}))
    now[0] = 4.0
    assert queue.current() is None  # not re-read before refresh_s
    now[0] = 5.0
    assert queue.current() == (PendingJob("w", 2, 640.0),)
    path.write_text("{not json")
    now[0] = 20.0
    assert queue.current() == (PendingJob("w", 2, 640.0),)  # a bad read keeps the last good queue...
    now[0] = 36.0
    assert queue.current() is None  # ... until it is stale
    path.write_text(json.dumps({"jobs": []}))
    now[0] = 41.0
    assert queue.current() == ()


def test_a_queue_file_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pending.json"
    path.write_text(json.dumps({"jobs": [{"gpus": 1}]}))
    with pytest.raises(PendingQueueError, match="is not"):
        FileQueue(path).read()
