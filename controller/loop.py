"""One control step: registry -> policy -> reconciler -> backend.

The policy decides from plain data; the reconciler writes only what changed (and logs
each write and each failure). This module sits between them: it records each job's
decision in the registry, logs each new decision once at INFO with the reason it was
made, and counts reallocations by reason and backend failures.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from adloader.cpuspec import format_cpus
from controller import faults
from controller.allocations import AllocationStore, ApplyFailure
from controller.backends.base import BackendError, ResourceBackend
from controller.change_clock import ChangeClock, settling
from controller.policies.base import JobAllocation, JobView, NodeResources, Policy
from controller.reconciler import Change, Failure, reconcile
from controller.registry import Registry
from controller.safety_net import SafetyNet
from controller.training_processes import TrainingProcesses
from controller.worker_memory import WorkerMemory
from controller.worker_pins import apply_pins

log = logging.getLogger(__name__)

REASON_PRIORITY = ("policy_change", "workers_pinned", "adoption", "arrival", "departure")
"""When several events happened since the last step, a reallocation is counted under the
first of these; with none of them the policy acted on new measurements: "gain"."""


@dataclass(frozen=True)
class StepOutcome:
    wanted: dict[str, JobAllocation]
    changes: list[Change]
    failures: list[Failure]
    reason: str | None
    """Why the decision changed, None when it did not (no reallocation)."""
    seconds: float
    pids: dict[str, set[int]]
    """Each job's processes as read at this step (the daemon's snapshot uses them instead of
    reading every job's cgroup.procs again)."""
    settling: bool = False
    """The node is still settling (:func:`controller.change_clock.settling`): the daemon steps
    at its settle period."""


class ControlLoop:
    """Writes the policy's decisions and the reconciler's results into ``allocations`` (the
    one store of wanted and applied), and keeps the counters."""

    def __init__(
        self, backend: ResourceBackend, node: NodeResources, policy: Policy,
        clock: Callable[[], float] = time.perf_counter,
        change_clock: ChangeClock | None = None,
        safety_net: SafetyNet | None = None,
        worker_memory: WorkerMemory | None = None,
        allocations: AllocationStore | None = None,
        training: TrainingProcesses | None = None,
    ) -> None:
        """``worker_memory``: caps each job's workers to what fits in its memory (None: no cap);
        ``training``: keeps ranks apart from their job's CPU group (None: every process stays in it)."""
        self.backend = backend
        self.node = node
        self.policy = policy
        self.allocations = allocations if allocations is not None else AllocationStore()
        self.reallocations: Counter[str] = Counter()
        self.backend_failures = 0
        self.last_step_seconds = 0.0
        self._clock = clock
        self.change_clock = change_clock or ChangeClock()
        self.safety_net = safety_net or SafetyNet()
        self.worker_memory = worker_memory
        self.training = training
        self._cpu_limits: dict[str, float | None] = {}
        """Each job's scheduler CPU limit as last logged."""

    def forget(self, job_id: str) -> None:
        """The job is gone: nothing of it is wanted or applied any more."""
        self.allocations.forget(job_id)
        self._cpu_limits.pop(job_id, None)
        if self.training is not None:
            self.training.forget(job_id)

    def step(self, registry: Registry, events: Iterable[str] = ()) -> StepOutcome:
        """Decide, record and apply once. ``events`` are what happened since the last step
        ("arrival", "departure", "policy_change", "adoption"): they name the reason."""
        start = self._clock()
        registry.measure(self._cpu_seconds(registry))
        events = set(events)
        store = self.allocations
        applied = {job_id: store.get(job_id).applied for job_id in store}
        views = self.change_clock.annotate(
            [self._placed(view) for view in registry.views(applied)], events
        )
        pids = self._pids(views)
        if self.training is not None:
            for job_id in pids:
                if self.training.regrouped(job_id):
                    registry.regrouped(job_id)  # its group's CPU so far was not its loading's alone
        if self.worker_memory is not None:
            views = self.worker_memory.annotate(views, pids)
        wanted = {view.job_id: JobAllocation() for view in views}
        wanted.update({k: v for k, v in self.policy.allocate(self.node, views).items() if k in wanted})
        reason = _reason(events)
        wanted, reverts = self.safety_net.review(views, wanted, gain_driven=reason == "gain", node=self.node)
        if reverts:
            reason = "safety_net"
        # An operator's pins (adloader workers) replace the workers of the finished decision, here only.
        wanted = apply_pins(self.node, views, wanted, registry.pinned_workers())
        changed = False
        for view in views:
            new, record = wanted[view.job_id], store.get(view.job_id)
            first = view.job_id not in store or not record.confirmed  # arrived, or adopted from an earlier run
            old = JobAllocation() if first else record.wanted
            if (store.want(view.job_id, new) or first) and new != old:
                changed = True
                log.info(
                    "job %s (%s): %s (policy %s, reason: %s)", view.job_id, view.name,
                    describe_change(old, new), self.policy.name, reason,
                )
        if changed:
            self.reallocations[reason] += 1
        in_force = {job_id: record.applied for job_id in wanted if (record := store.get(job_id)).confirmed}
        result = reconcile(self.backend, self.node, wanted, in_force)
        for job_id, applied in result.applied.items():
            failures = tuple(ApplyFailure(f.field, f.error) for f in result.failures if f.job_id == job_id)
            store.record_applied(job_id, applied, failures)
        self.change_clock.applied(wanted)
        self.backend_failures += len(result.failures)
        faults.hit("loop.after_reconcile")
        self.last_step_seconds = self._clock() - start
        return StepOutcome(
            wanted=wanted, changes=list(result.changes), failures=list(result.failures),
            reason=reason if changed else None, seconds=self.last_step_seconds, pids=pids,
            settling=settling(views),
        )


    def _pids(self, views: Iterable[JobView]) -> dict[str, set[int]]:
        """Each job's processes: its group's (a job whose group is going away has none) and its
        ranks kept apart, which are placed here (see training_processes.py)."""
        pids = {}
        for view in views:
            try:
                group = self.backend.pids(view.job_id)
            except BackendError:
                continue
            pids[view.job_id] = group if self.training is None else self.training.place(view.job_id, group)
        return pids

    def _placed(self, view: JobView) -> JobView:
        """``view`` with what its placement allows: the levers that act on the job (the policy
        plans only on these) and the most cores its scheduler lets it use, where fewer than the node
        manages (logged once a change)."""
        placement = self.backend.placement(view.job_id)
        limit = placement.cpu_limit
        if limit is not None and limit >= self.node.cores:
            limit = None  # no fewer than the node manages: nothing to plan within
        if self._cpu_limits.get(view.job_id) != limit:  # a job never limited is never logged
            self._cpu_limits[view.job_id] = limit
            if limit is None:
                log.info("job %s (%s): its scheduler's CPU limit is lifted", view.job_id, view.name)
            else:
                log.info("job %s (%s): its scheduler lets it use at most %.2f cores (a CPU quota on its cgroup "
                         "or above, or its cpuset): planned within them", view.job_id, view.name, limit)
        return replace(view, levers=placement.capabilities, max_cores=limit)

    def _cpu_seconds(self, registry: Registry) -> dict[str, float] | None:
        """Each job's group CPU time, when the backend accounts for it (None otherwise)."""
        if "cpu_accounting" not in self.backend.capabilities:
            return None
        seconds = {}
        for job in registry:
            try:
                seconds[job.job_id] = self.backend.cpu_seconds(job.job_id)
            except BackendError:
                continue  # the group is going away: its curve simply gets no point this step
        return seconds


def _reason(events: set[str]) -> str:
    return next((r for r in REASON_PRIORITY if r in events), "gain")


def describe_change(old: JobAllocation, new: JobAllocation) -> str:
    """"cores 1.00 -> 0.50, workers 2 -> 1": the fields that differ, for the decision log."""
    parts = []
    for field_, fmt in (("cores", _cores), ("cpu_weight", str), ("cpus", format_cpus), ("read_bps", _bps),
                        ("workers", str)):
        before, after = getattr(old, field_), getattr(new, field_)
        if before != after:
            parts.append(f"{field_} {_or_unset(before, fmt)} -> {_or_unset(after, fmt)}")
    return ", ".join(parts) or "unchanged"


def _or_unset(value: object, fmt: Callable[..., str]) -> str:
    return "unset" if value is None else fmt(value)


def _cores(value: float) -> str:
    return f"{value:.2f}"


def _bps(value: int) -> str:
    return f"{value / 1e6:.1f}MB/s"
