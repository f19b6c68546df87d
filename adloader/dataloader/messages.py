"""The messages between the dispatcher, a loader worker and the helper that forks workers, one typed
class each.

NamedTuples: named, typed fields for the reader, and pickled as cheaply as the plain tuples they
replace (a batch's header is sent with every batch, so the small-batch loader pays for every byte).
Each worker-to-dispatcher message carries ``usage``: the worker's CPU seconds, storage read
bytes and wall seconds spent loading batches since its previous message (see stats.ResourceMeter).

  dispatcher -> worker: Task, Retire, Stop
  worker -> dispatcher: Ready, InitFailed, Result (then the batch itself as a separate message of
                        pickled bytes, so that a batch that cannot be rebuilt is still known by number),
                        Ended, Retired
  training process -> helper (spawner.py): Spawn (the worker's end of its connection attached)
  helper -> training process: Hello, Spawned, Exited
Readers dispatch on the class and read fields by name, never by position.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Usage(NamedTuple):
    """A process's (or thread's) CPU seconds and storage read bytes over some interval, and the
    wall seconds of it spent loading batches (fetch, collate and pickle; not waiting for a task)."""

    cpu_s: float
    read_bytes: int
    load_s: float = 0.0


class WorkerIdentity(NamedTuple):
    """What ``torch.utils.data.get_worker_info()`` reports in a worker."""

    id: int
    num_workers: int
    seed: int


class Task(NamedTuple):
    """Load batch ``batch`` of epoch ``epoch``: ``payload`` is its indices (map-style) or its size
    (iterable); ``seed`` seeds the RNGs just before (seeding.py)."""

    epoch: int
    batch: int
    payload: Any
    seed: int


class Retire(NamedTuple):
    """Finish the batch in hand, answer Retired with the tasks not started, then wait for Stop."""


class Stop(NamedTuple):
    """Exit now (everything the worker sent has been read)."""


class Ready(NamedTuple):
    pid: int
    usage: Usage


class InitFailed(NamedTuple):
    error: Any  # torch's ExceptionWrapper around what worker_init_fn or unpickling raised
    usage: Usage


class Result(NamedTuple):
    epoch: int
    batch: int
    n_samples: int
    failed: bool  # the batch is a torch ExceptionWrapper: the dataset raised
    usage: Usage


class Ended(NamedTuple):
    """An iterable stream ended at this task: the batch delivers nothing."""

    epoch: int
    batch: int
    usage: Usage


class Retired(NamedTuple):
    unstarted: list[int]  # batch numbers handed back
    usage: Usage


class Spawn(NamedTuple):
    """Fork one worker; ``token`` names it until its pid is known."""

    token: int
    identity: WorkerIdentity


class Hello(NamedTuple):
    """The helper got past its own start-up."""


class Spawned(NamedTuple):
    token: int
    pid: int


class Exited(NamedTuple):
    """A worker was reaped; ``status`` is its wait status (os.waitstatus_to_exitcode)."""

    pid: int
    status: int


FromWorker = Ready | InitFailed | Result | Ended | Retired
ToWorker = Task | Retire | Stop
FromHelper = Hello | Spawned | Exited
HelperNews = Spawned | Exited
