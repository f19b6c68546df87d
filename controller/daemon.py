"""The node daemon: wires the socket server, the job registry, the control loop, the state
file and the metrics exporter, and owns their lifecycle.

Start: refuse if another controller holds the cgroup group or the state directory
(:mod:`controller.ownership`), or answers on the socket; recover from the state
file (adopt the groups of jobs still alive, remove those of dead ones), then serve
and run the control loop every period. Stop (SIGTERM/SIGINT): stop serving, remove
the socket, lift every limit (the jobs keep running, unmanaged) and save the state so
a restarted controller adopts them again.

Everything runs on one asyncio thread: request handlers and control steps never
interleave. The metrics exporter's HTTP thread only reads the last published
NodeSnapshot, which is immutable.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from adloader import __version__, paths, protocol
from controller import faults
from controller.backends.base import BackendError, ResourceBackend
from controller.backends.detect import detect_backend
from adloader.cpuspec import format_cpus
from controller.change_clock import ChangeClock, step_period
from controller.cpu_wait import CpuWait
from controller.loop import ControlLoop
from controller.ownership import Holder, Ownership
from controller.training_processes import TrainingProcesses
from controller.worker_memory import WorkerMemory
from controller.worker_pins import max_pin
from controller.peer import peer_belongs_to_job
from controller.pending_queue import PendingQueue, queue_source
from controller.policies import AdaptiveRules, JobAllocation, NodeResources, PolicyError, make_policy, policy_names
from controller.priors import JobFinishedHook, Predictor, Recall
from controller.registry import Job, Registry
from controller.safety_net import SafetyNet
from controller.target_reason import target_reason
from controller.unmanaged import DEFAULT_GRACE_S
from controller.server import Connection, ControlServer, RequestRefused
from controller.snapshot import JobSnapshot, NodeSnapshot
from controller.state import STATE_VERSION, ControllerState, PersistedJob, StateStore, StateWriteError

log = logging.getLogger(__name__)

MODEL_CHECKPOINT_S = 10.0
"""Longest time between two saves of what the jobs' models learnt (see Controller.step)."""


def default_policy() -> str:
    """The product's policy when it is installed, else the even split."""
    return "adaptive" if "adaptive" in policy_names() else "even"


@dataclass(frozen=True)
class ControllerConfig:
    socket_path: Path
    state_dir: Path
    cpus: tuple[int, ...]
    policy: str | None = None
    """None: the policy the state file remembers, else :func:`default_policy`."""
    period_s: float = 1.0
    settle_period_s: float = 0.5
    """The period while the node settles (until every reporting newcomer's loading curve has
    matured; :func:`controller.change_clock.settling`); never longer than
    ``period_s``. A newcomer's curve is learnt from one window per step, so its plan comes in
    about half the time, while the steady state keeps the cheaper ``period_s``."""
    backend: str | None = None
    """"cgroup-v1", "cgroup-v2", "affinity", or None to detect."""
    group: str = "adloader"
    read_bps: float | None = None
    read_device: str | None = None
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    window_s: float = 5.0
    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc: Path = Path("/proc")
    lock_dir: Path = field(default_factory=paths.default_lock_dir)
    """Where the per-group lock files live (shared by every controller on the node)."""
    memory_reserve: int | None = None
    """Bytes of node memory no job's workers may take (None: 5% of MemTotal, at least 1 GiB)."""
    training_processes: str = "apart"
    """"apart": ranks whose loaders run workers leave their job's CPU group (training_processes.py);
    "with-loaders": every process of a job stays in it."""
    unmanaged_after_s: float = DEFAULT_GRACE_S
    """Seconds a job may run without a loader report before status calls it unmanaged
    (controller/unmanaged.py); its launcher then warns in the job's output."""
    pending: str | None = None
    """Where the jobs waiting for this node's GPUs are read (controller/pending_queue.py: "slurm",
    "slurm:PART,...", or a JSON file); None: no queue is watched."""
    rules: AdaptiveRules = AdaptiveRules()
    """Which of ``adaptive``'s rules are on (all; ``--without`` turns some off for an ablation)."""


class Controller:
    """One node's controller. ``run()`` serves until ``request_stop()``."""

    def __init__(
        self,
        config: ControllerConfig,
        *,
        backend: ResourceBackend | None = None,
        predictor: Predictor | None = None,
        on_job_finished: JobFinishedHook | None = None,
        recall: Recall | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the monotonic clock of the control step (report windows, allocation ages,
        the safety net's and worker memory's timers), injectable for tests."""
        self.config = config
        self.backend = backend or detect_backend(config.backend, config.group, config.cgroup_root, config.proc)
        self.node = NodeResources(cpus=config.cpus, read_bps=config.read_bps, read_device=config.read_device)
        self.pending = PendingQueue(queue_source(config.pending), clock=clock) if config.pending else None
        self.registry = Registry(window_s=config.window_s, predictor=predictor, on_job_finished=on_job_finished,
                                 recall=recall, clock=clock, unmanaged_after_s=config.unmanaged_after_s)
        self.store = StateStore(config.state_dir)
        self.ownership = Ownership(config.lock_dir, config.group, config.state_dir)
        self.training = TrainingProcesses(self.backend, proc=config.proc, mode=config.training_processes)
        self.cpu_wait = CpuWait(proc=config.proc, clock=clock)
        self._memory_reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adloader-worker-memory")
        self.loop = ControlLoop(
            self.backend, self.node, make_policy(config.policy or default_policy(), config.rules),
            change_clock=ChangeClock(clock=clock),
            safety_net=SafetyNet(clock=clock, window_s=config.window_s, enabled=config.rules.safety_net),
            worker_memory=WorkerMemory(config.memory_reserve, proc=config.proc, cgroup_root=config.cgroup_root,
                                       ceiling_per_rank=self.node.max_workers_per_job, executor=self._memory_reads,
                                       clock=clock),
            training=self.training,
        )
        self.server = ControlServer(config.socket_path, self.handle, self._connection_closed, self._count_error)
        self.started_at = time.time()
        self.errors: Counter[str] = Counter()
        self.state_write_failures = 0
        self.state_corruptions = 0
        self.backend_failures = 0
        self._events: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._settling = True
        """Whether the last step found the node settling; until one has, it is (jobs adopted
        after a restart are planned anew)."""
        self._stopping = False
        self._metrics = None
        self._model_saved_at = 0.0
        self._published: NodeSnapshot = self.snapshot()

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Serve and control until request_stop(); then release limits and clean up."""
        self._wake = asyncio.Event()
        await self.server.start()  # refuses first if another controller answers there
        try:
            self.ownership.acquire(Holder(pid=os.getpid(), socket=str(self.config.socket_path),
                                          state_dir=str(self.config.state_dir), group=self.config.group))
        except BaseException:
            await self.server.stop()
            raise
        try:
            self.recover()
            self._start_metrics()
            log.info("managing CPUs %s with policy %s, period %gs (%gs while settling), read bandwidth %s; "
                     "%d job(s) adopted", format_cpus(self.node.cpus), self.loop.policy.name, self.config.period_s,
                     step_period(True, self.config.period_s, self.config.settle_period_s),
                     f"{self.node.read_bps:g} B/s on {self.node.read_device}" if self.node.read_bps else "unmanaged",
                     len(self.registry))
            while not self._stopping:
                self._guarded_step()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.next_period_s())
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()
        finally:
            await self._shut_down()

    def next_period_s(self) -> float:
        """The settle period while the last step found the node settling, else the period."""
        return step_period(self._settling, self.config.period_s, self.config.settle_period_s)

    def request_stop(self) -> None:
        """Stop at the end of the current step (safe to call from a signal handler on the loop)."""
        log.info("stopping: releasing limits, removing %s; jobs keep running", self.config.socket_path)
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    async def _shut_down(self) -> None:
        await self.server.stop()
        self._reap()  # jobs that ended since the last step leave no group behind
        for job in self.registry:
            try:
                self.backend.release(job.job_id)
            except BackendError as exc:
                log.warning("could not lift the limits of job %s: %s", job.job_id, exc)
        self.save()
        if self._metrics is not None:
            self._metrics.stop()
        self._memory_reads.shutdown(wait=False, cancel_futures=True)
        self.ownership.release()
        log.info("stopped; %d job(s) left running unmanaged, state saved in %s", len(self.registry), self.store.path)

    def _start_metrics(self) -> None:
        if not self.config.metrics_port:
            return
        from controller.metrics import MetricsExporter  # prometheus_client only when asked for

        self._metrics = MetricsExporter(lambda: self._published)
        self._metrics.start(self.config.metrics_address, self.config.metrics_port)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> None:
        """Take over what an earlier controller left: adopt the groups of live jobs (their limits
        are restored by the first step), remove those of dead jobs and unknown empty groups.
        A corrupt state file (already moved aside by the store) is rebuilt from the cgroup tree."""
        loaded = self.store.load()
        persisted: dict[str, PersistedJob] = {}
        if loaded.problem is not None:
            self.state_corruptions += 1
            log.error("state file unusable, rebuilding from the cgroup tree: %s", loaded.problem)
        elif loaded.state is not None:
            persisted = dict(loaded.state.jobs)
            if self.config.policy is None:
                self._restore_saved_policy(loaded.state.policy)
        existing = set(self.backend.existing_jobs())
        adopted = 0
        for job_id in sorted(existing | set(persisted)):
            pids = self.backend.pids(job_id) if job_id in existing else set()
            if not pids:
                if job_id in existing:
                    self._remove_group(job_id, "its processes are gone")
                else:
                    log.info("job %s (%s) from the state file has no group and no process: dropped",
                             job_id, persisted[job_id].name)
                continue
            record = persisted.get(job_id) or self._rebuilt_record(job_id, pids)
            cgroup = self.backend.create(job_id)
            self.registry.adopt(replace(record, cgroup=cgroup))
            self.loop.allocations.restore(job_id, record.wanted, record.applied)
            adopted += 1
            log.info("adopted job %s (%s) with %d live process(es)", job_id, record.name, len(pids))
            if adopted == 1:
                faults.hit("adopt.mid_adoption")
        if adopted:
            self._events.add("adoption")
        self.save()

    def _rebuilt_record(self, job_id: str, pids: set[int]) -> PersistedJob:
        """What can be known of a job the state file does not describe: its processes' owner."""
        lowest = min(pids)
        try:
            uid = (self.config.proc / str(lowest)).stat().st_uid
        except OSError:
            uid = 0
        return PersistedJob(
            job_id=job_id, name=f"adopted-{job_id}", uid=uid, gpus=1, launcher_pid=lowest,
            registered_at=time.time(), cgroup="", wanted=JobAllocation(), applied=JobAllocation(),
            requested_workers=None, features=None,
        )

    def _restore_saved_policy(self, name: str) -> None:
        try:
            self.loop.policy = make_policy(name, self.config.rules)
        except PolicyError as exc:
            log.warning("the saved policy cannot be used (%s); keeping %s", exc, self.loop.policy.name)

    # ------------------------------------------------------------------ the control step

    def _guarded_step(self) -> None:
        """A step that fails (a policy bug) is logged and counted; the daemon keeps serving and
        the jobs keep their last limits."""
        try:
            self.step()
        except Exception:
            self.errors["internal"] += 1
            log.exception("control step failed; keeping the current limits and retrying next period")

    def step(self) -> None:
        """Remove gone jobs, decide and apply, save when something changed, publish a snapshot."""
        waited = self.cpu_wait.observe(self.next_period_s())
        events, self._events = self._events, set()
        if self._reap():
            events.add("departure")
        if self.pending is not None:  # what waits for the node's GPUs, plain data in the policy's input
            self.loop.node = replace(self.node, pending=self.pending.current())
        outcome = self.loop.step(self.registry, events)
        self._settling = outcome.settling
        if self.loop.allocations.dirty or events or self._model_checkpoint_due():
            self.save()
        self._published = self.snapshot(outcome.pids)
        if self._metrics is not None:
            self._metrics.observe_loop(outcome.seconds)
            self._metrics.observe_cpu_wait(waited)

    def _reap(self) -> bool:
        """Remove every job whose launcher connection closed (or that ended) and whose
        processes are all gone. True if any was removed."""
        removed = False
        for job in list(self.registry):
            if (job.connected and not job.ended) or self._pids(job.job_id):
                continue
            why = f"exited with code {job.exit_code}" if job.ended else "launcher disconnected, no process left"
            cpu_seconds = self._cpu_seconds(job.job_id)
            if not self._remove_group(job.job_id, why):
                continue
            self.registry.remove(job.job_id, pids=set(), cpu_seconds=cpu_seconds,
                                 allocation=self.loop.allocations.get(job.job_id))
            self.loop.forget(job.job_id)
            removed = True
        self.backend.tidy()
        return removed

    def _remove_group(self, job_id: str, why: str) -> bool:
        try:
            self.backend.remove(job_id)
        except BackendError as exc:
            self.backend_failures += 1
            log.warning("job %s (%s): could not remove its group, retrying next period: %s", job_id, why, exc)
            return False
        log.info("job %s: %s; group removed, its share returns to the pool", job_id, why)
        faults.hit("remove.mid_removal")
        return True

    def save(self) -> bool:
        """Write the state file; False (logged and counted) if it cannot be written."""
        state = ControllerState(
            version=STATE_VERSION, policy=self.loop.policy.name,
            jobs=self.registry.persisted(self.loop.allocations), saved_at=0.0,
        )
        try:
            saved = self.store.save(state)
        except StateWriteError as exc:
            self.state_write_failures += 1
            log.error("%s", exc)
            return False
        self.loop.allocations.dirty = False
        self._model_saved_at = saved.saved_at
        return True

    def _model_checkpoint_due(self) -> bool:
        """What the jobs' models learnt is saved at least every MODEL_CHECKPOINT_S (with every
        allocation change too), so a restart resumes from a recent model, not from scratch."""
        return bool(len(self.registry)) and time.time() - self._model_saved_at >= MODEL_CHECKPOINT_S

    # ------------------------------------------------------------------ requests

    def handle(self, message: protocol.Message, connection: Connection) -> protocol.Message:
        """Answer one request from ``connection``'s peer. RequestRefused becomes an Error reply."""
        if isinstance(message, protocol.Report):
            return self._report(message, connection)
        if isinstance(message, protocol.Register):
            return self._register(message, connection)
        if isinstance(message, protocol.End):
            return self._end(message, connection)
        if isinstance(message, protocol.StatusRequest):
            return self._status()
        if isinstance(message, protocol.SetPolicy):
            return self._set_policy(message, connection)
        if isinstance(message, protocol.SetWorkers):
            return self._set_workers(message, connection)
        raise RequestRefused("unknown_type", f"{message.TYPE} is a reply, not a request")

    def _register(self, message: protocol.Register, connection: Connection) -> protocol.Message:
        if connection.job_id is not None:
            raise RequestRefused("already_registered", f"this connection already registered job {connection.job_id}")
        peer = connection.peer
        job_id = self.registry.new_job_id()
        try:
            cgroup = self.backend.create(job_id, near_pid=peer.pid)  # nested below the launcher's cgroups
            self.backend.attach(job_id, peer.pid)
        except BackendError as exc:
            self.backend_failures += 1
            self._remove_group(job_id, "registration failed")
            raise RequestRefused("backend_failed", f"could not put pid {peer.pid} into a group of its own: {exc}")
        faults.hit("register.after_cgroup")
        self.registry.register(
            job_id, name=message.name, uid=peer.uid, gpus=message.gpus, launcher_pid=peer.pid, cgroup=cgroup,
            requested_workers=message.num_workers, features=message.features, declared_samples=message.samples,
        )
        connection.job_id = job_id
        connection.verified_jobs.add(job_id)
        log.info("job %s (%s) registered by pid %d (uid %d), %d GPU(s), group %s",
                 job_id, message.name, peer.pid, peer.uid, message.gpus, cgroup)
        self._events.add("arrival")
        self._guarded_step()  # the job's first limits are in force before its command starts
        return protocol.Registered(job_id=job_id, cgroup=cgroup, backend=self.backend.name)

    def _report(self, message: protocol.Report, connection: Connection) -> protocol.Message:
        job = self._known_job(message.job_id)
        if job.job_id not in connection.verified_jobs:
            if not peer_belongs_to_job(
                connection.peer.pid, job.job_id, self.config.group, self.backend.pids, self.config.proc
            ):
                raise RequestRefused(
                    "forbidden", f"pid {connection.peer.pid} is not in job {job.job_id}'s group: a process may "
                    "report only for the job it runs in"
                )
            connection.verified_jobs.add(job.job_id)
        self.registry.record_report(job.job_id, message)
        self.training.reported(
            job.job_id, connection.peer.pid, message.num_workers, message.batches, message.loader_pids,
        )
        wanted = self.loop.allocations.get(job.job_id).wanted
        memory = self.loop.worker_memory
        reason = target_reason(self.loop.policy.name, wanted, job.measurement.ranks,
                               memory.workers_limit(job.job_id) if memory is not None else None, job.pinned_workers)
        return protocol.Target(num_workers=wanted.workers, reason=reason)

    def _end(self, message: protocol.End, connection: Connection) -> protocol.Message:
        job = self._owned_job(message.job_id, connection, "end it")
        self.registry.end(job.job_id, message.exit_code)
        log.info("job %s (%s) ended with exit code %d", job.job_id, job.name, message.exit_code)
        self._notify("departure")
        return protocol.Ok()

    def _set_policy(self, message: protocol.SetPolicy, connection: Connection) -> protocol.Message:
        if not connection.peer.is_root:
            raise RequestRefused("forbidden", "only root may change the node's policy")
        try:
            policy = make_policy(message.policy, self.config.rules)
        except PolicyError as exc:
            raise RequestRefused("bad_policy", str(exc)) from None
        previous, self.loop.policy = self.loop.policy, policy
        if not self.save():  # only the state file remembers a policy: one it cannot keep is refused
            self.loop.policy = previous
            raise RequestRefused("state_unwritable", f"the policy stays {previous.name}: the state file "
                                 f"{self.store.path} cannot be written (see the controller's log); free space "
                                 "there or make it writable, then ask again")
        log.info("policy changed from %s to %s by pid %d", previous.name, policy.name, connection.peer.pid)
        self._notify("policy_change")
        return protocol.Ok()

    def _set_workers(self, message: protocol.SetWorkers, connection: Connection) -> protocol.Message:
        """Pin the job's workers (all ranks) over its policy's, or give them back (None)."""
        job = self._owned_job(message.job_id, connection, "change its workers")
        if job.unmanaged_reason is not None:
            raise RequestRefused("not_managed", f"job {job.job_id} has no loader of adloader's to set workers on "
                                 f"({job.unmanaged_reason}); see 'adloader status'")
        ranks = job.measurement.ranks
        most = max_pin(self.node, ranks)
        if message.num_workers is not None and message.num_workers > most:
            raise RequestRefused("bad_workers", f"job {job.job_id} can run at most {most} workers "
                                 f"({self.node.max_workers_per_job} a rank, {ranks} rank(s)): give 1 to {most}, "
                                 "or 'auto' to let the policy decide")
        if self.registry.pin_workers(job.job_id, message.num_workers):
            peer = connection.peer
            log.info("job %s (%s): workers %s by uid %d (pid %d)", job.job_id, job.name,
                     "given back to the policy" if message.num_workers is None
                     else f"pinned to {message.num_workers} in all", peer.uid, peer.pid)
            self._notify("workers_pinned")
        return protocol.Ok()

    def _status(self) -> protocol.Message:
        """The node's counters now, its jobs as the last control step measured them (what the
        metrics show too): a job's snapshot reads its group, and the benchmark alone asks
        twice a second."""
        return protocol.Status(node=self._node_snapshot(self._published.jobs))

    def _known_job(self, job_id: str) -> Job:
        job = self.registry.get(job_id)
        if job is None:
            raise RequestRefused("unknown_job", f"no job {job_id!r} is registered with this controller; "
                                 "'adloader status' lists the jobs and their ids")
        return job

    def _owned_job(self, job_id: str, connection: Connection, action: str) -> Job:
        """The job, when the peer may change it: its owner (the uid that registered it) or root."""
        job = self._known_job(job_id)
        if not (connection.peer.is_root or connection.peer.uid == job.uid):
            raise RequestRefused("forbidden",
                                 f"job {job.job_id} belongs to uid {job.uid}; only it or root may {action}")
        return job

    def _connection_closed(self, connection: Connection) -> None:
        if connection.job_id is not None and connection.job_id in self.registry:
            log.info("job %s: launcher connection closed", connection.job_id)
            self.registry.disconnected(connection.job_id)
            if self._wake is not None:
                self._wake.set()

    def _notify(self, event: str) -> None:
        self._events.add(event)
        if self._wake is not None:
            self._wake.set()

    def _count_error(self, code: str) -> None:
        self.errors[code] += 1

    # ------------------------------------------------------------------ reading

    def snapshot(self, pids: Mapping[str, set[int]] | None = None) -> NodeSnapshot:
        """The node as it is now; ``pids``: jobs' processes already read at this step (the
        others' are read here)."""
        known = pids or {}
        return self._node_snapshot(tuple(
            self._placed(self.registry.snapshot(
                job, pids=known[job.job_id] if job.job_id in known else self._pids(job.job_id),
                allocation=self.loop.allocations.get(job.job_id)))
            for job in self.registry
        ))

    def _node_snapshot(self, jobs: tuple[JobSnapshot, ...]) -> NodeSnapshot:
        """``jobs`` with the node's settings and counters as they are now."""
        return NodeSnapshot(
            version=__version__, policy=self.loop.policy.name, backend=self.backend.name,
            started_at=self.started_at, period_s=self.config.period_s, cpus=self.node.cpus,
            read_bps=self.node.read_bps, read_device=self.node.read_device, jobs=jobs,
            connected_clients=self.server.clients, last_loop_seconds=self.loop.last_step_seconds,
            reallocations_total=dict(self.loop.reallocations), errors_total=dict(self.errors),
            state_write_failures_total=self.state_write_failures, state_corruptions_total=self.state_corruptions,
            backend_failures_total=self.backend_failures + self.loop.backend_failures,
        )

    def _placed(self, job: JobSnapshot) -> JobSnapshot:
        """The snapshot with where the backend placed the job (nested placement) and the CPU its
        scheduler lets it use, what a
        worker costs and how many its memory holds, and its ranks kept out of its CPU group."""
        placement = self.backend.placement(job.job_id)
        memory = self.loop.worker_memory
        placed = replace(job, scheduler=placement.scheduler, cgroups=dict(placement.paths),
                         scheduler_cpu_limit=placement.cpu_limit,
                         training_processes_apart=self.training.apart(job.job_id))
        cost = memory.cost_of(job.job_id) if memory is not None else None
        if memory is None or cost is None:
            return placed
        return replace(placed, workers_memory_limit=memory.workers_limit(job.job_id),
                       worker_memory_bytes=cost.per_worker, worker_prefetch_bytes=cost.prefetch_bytes,
                       worker_memory_exact=not cost.upper_bound)

    def _pids(self, job_id: str) -> set[int]:
        try:
            return self.backend.pids(job_id)
        except BackendError:
            return set()

    def _cpu_seconds(self, job_id: str) -> float:
        if "cpu_accounting" not in self.backend.capabilities:
            return 0.0
        try:
            return self.backend.cpu_seconds(job_id)
        except BackendError:
            return 0.0
