"""The loop a loader worker process runs, and the messages it exchanges with the dispatcher.

One duplex connection per worker (no queue shared between workers, so a
worker killed mid-write cannot wedge the others). The worker keeps the tasks
it was sent in a local FIFO, draining the connection before each batch, so a
RETIRE message is seen between two batches: the worker answers with the tasks
it had not started, and the dispatcher gives those to others.

A worker exits only on STOP (or when the training process goes away): tensors
travel as shared-memory file descriptors that the receiver fetches from the
sender *while unpickling*, so a worker must stay alive until everything it
sent has been read. After RETIRED the dispatcher, having read all, sends STOP.

The messages are the typed classes of messages.py.
"""
from __future__ import annotations

import os
import time
from collections import deque
from multiprocessing.connection import Connection

import torch
import torch.utils.data._utils.worker as torch_worker
from torch._utils import ExceptionWrapper

from adloader.dataloader import handoff, transfer
from adloader.dataloader.fetch import FetchSpec, StreamEnded, fetch_iterable, fetch_map
from adloader.dataloader.messages import Ended, InitFailed, Ready, Result, Retire, Retired, Task, WorkerIdentity
from adloader.dataloader.seeding import MASK64, seed_all, seed_worker
from adloader.dataloader.stats import ResourceMeter


def worker_main(conn: Connection, spec: FetchSpec | None, identity: WorkerIdentity, proc_root: str) -> None:
    """Run one worker until told to stop or retire, or until the training process goes away. ``spec`` is
    None under spawn/forkserver: the training process sends this worker its own pickle (handoff.py)."""
    meter = ResourceMeter(proc_root)
    try:
        if spec is None:
            spec = handoff.receive(conn)
        _become_worker(spec, identity)
    except Exception:
        conn.send(InitFailed(ExceptionWrapper(where=f"in loader worker {identity.id} start-up"), meter.delta()))
        return
    conn.send(Ready(os.getpid(), meter.delta()))
    _serve(conn, spec, meter, identity.id)


def _become_worker(spec: FetchSpec, identity: WorkerIdentity) -> None:
    """Set up the process the way torch sets up its workers, so datasets see the same world."""
    torch.set_num_threads(1)
    seed_worker(identity.seed)
    # torch.utils.data.get_worker_info() returns this module global; default_collate also reads
    # it to build batches directly in shared memory.
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=identity.id, num_workers=identity.num_workers, seed=identity.seed & MASK64, dataset=spec.dataset
    )
    if spec.worker_init_fn is not None:
        spec.worker_init_fn(identity.id)


def _serve(conn: Connection, spec: FetchSpec, meter: ResourceMeter, worker_id: int) -> None:
    tasks: deque[Task] = deque()
    stream = None
    stream_epoch = -1
    while True:
        while not tasks or conn.poll(0):
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the training process closed our connection: it is gone or shutting down
            if isinstance(message, Task):
                tasks.append(message)
            elif isinstance(message, Retire):
                conn.send(Retired([task.batch for task in tasks], meter.delta()))
                tasks.clear()
            else:  # Stop
                return
        task = tasks.popleft()
        started = time.perf_counter()
        seed_all(task.seed)
        try:
            if spec.iterable:
                if task.epoch != stream_epoch:
                    stream, stream_epoch = iter(spec.dataset), task.epoch
                data, n_samples = fetch_iterable(spec, stream, task.payload)
            else:
                data, n_samples = fetch_map(spec, task.payload)
            failed = False
        except StreamEnded:
            conn.send(Ended(task.epoch, task.batch, meter.delta(time.perf_counter() - started)))
            continue
        except Exception:
            data, n_samples, failed = ExceptionWrapper(where=f"in loader worker {worker_id}"), 0, True
        try:
            pickled = transfer.dumps(data)
        except Exception:  # the batch cannot be pickled: report that as the batch's error
            pickled = transfer.dumps(ExceptionWrapper(where=f"pickling a batch in loader worker {worker_id}"))
            n_samples, failed = 0, True
        del data
        try:
            conn.send(Result(task.epoch, task.batch, n_samples, failed, meter.delta(time.perf_counter() - started)))
            conn.send_bytes(pickled)
        except (BrokenPipeError, ConnectionResetError):
            return
