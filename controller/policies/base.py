"""The policy seam: plain data in, an allocation out. No I/O, no clock, no globals.

As kubelet's cpumanager Policy: a policy only decides; the reconciler applies. A
policy is handed the node's resources and a view of every live job (what it asked
for, what was measured, what it has now) and returns what each job should get.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from adloader.errors import AdloaderError
from controller.policies.pending import PendingJob


class PolicyError(AdloaderError):
    """A policy name or its configuration is invalid."""


@dataclass(frozen=True)
class NodeResources:
    """What the controller manages on this node."""

    cpus: tuple[int, ...]
    """CPU ids managed (``adloader controller --cpus``); jobs are confined to them."""
    read_bps: float | None = None
    """Read bandwidth of ``read_device`` in bytes/s to share out; None: not managed."""
    read_device: str | None = None
    """``major:minor`` of the block device the datasets are read from."""
    min_cores_per_job: float = 0.1
    """Floor: every job keeps at least this CPU quota, whatever the policy decides."""
    max_workers_per_job: int = 32
    pending: tuple[PendingJob, ...] | None = None
    """Jobs waiting for this node's GPUs (controller --pending); None: no queue is watched."""

    @property
    def cores(self) -> float:
        return float(len(self.cpus))


@dataclass(frozen=True)
class JobAllocation:
    """What one job is given. None in a field means 'leave it alone' (unlimited / own count)."""

    cores: float | None = None
    """CPU quota in cores (cfs_quota/cfs_period, cpu.max)."""
    cpu_weight: int | None = None
    """Relative CPU weight among the jobs when the CPUs are contended, on cgroup v2's
    cpu.weight scale (1-10000, 100 the kernel's default; v1 cpu.shares = weight·1024/100).
    Unlike a quota it is work-conserving: cycles a job leaves idle go to the others."""
    cpus: tuple[int, ...] | None = None
    """cpuset: which CPU ids the job may run on."""
    read_bps: int | None = None
    """Read throttle on the node's read device, bytes/s."""
    workers: int | None = None
    """DataLoader worker target per rank."""


@dataclass(frozen=True)
class JobView:
    """Everything a policy may know about a job. Rates are samples/s, summed over ranks."""

    job_id: str
    name: str
    gpus: int = 1
    ranks: int = 1
    requested_workers: int | None = None
    """num_workers the job asked for (what it would use unmanaged), per rank."""
    arrival_s: float = 0.0
    """Seconds since the controller started when the job registered (orders jobs; no clock here)."""
    max_throughput: float | None = None
    """M: samples/s when data never stalls (measured if available, else predicted)."""
    max_throughput_interval: tuple[float, float] | None = None
    cpu_s_per_sample: float | None = None
    """p: loader CPU seconds per sample."""
    bytes_per_sample: float | None = None
    """b: bytes read from storage per sample."""
    loading_curve: tuple[tuple[float, float], ...] = ()
    """Measured (cores, loading samples/s) points, concave through the origin; empty: use c/p."""
    curve_windows: int | None = None
    """Measurement windows behind ``loading_curve`` (0: a prior only); None: not tracked."""
    curve_batches: float | None = None
    """Batches the job delivered over those windows: the curve's rate is counted in whole
    batches, so its relative noise is about 1/sqrt(curve_batches). None: not counted (no
    doubt assumed)."""
    achieved: float | None = None
    """T: samples/s measured over the last window."""
    batch_size: int | None = None
    """Samples in one of a rank's batches: ``achieved`` is counted in whole batches, so a job
    delivering few of them a window measures a noisy rate. None: not known."""
    steady_workers: int | None = None
    """Loader workers per rank the job ran throughout that window (its rates were measured at
    this count); None: the count changed inside it, or is not known."""
    loads_in_flight: float | None = None
    """Batches the job's loaders were loading at once over that window, on average, summed over
    its ranks (its workers' wall time loading / the window); None: not timed (an older client)."""
    cores_used: float | None = None
    """Cores the job's group used over that window (its loader workers' where the group's CPU
    time is not accounted); None: not measured yet."""
    window_batches: float | None = None
    """Batches the job delivered over that window: ``achieved`` is counted in them, so its
    relative noise is about 1/sqrt(window_batches). None: not counted."""
    remaining_samples: float | None = None
    """Predicted samples left (from history or the job's own sample count); None: unknown."""
    length_samples: float | None = None
    """Samples the whole run trains on (the job's declared count, else its history's); None: unknown."""
    remaining_at_event_samples: float | None = None
    """``remaining_samples`` when the node's job set last changed (or when the job's remaining
    work first became known after that), so a policy can rank jobs by what was left then: a
    figure that moves only at arrivals and departures (controller/change_clock.py). None: not
    tracked."""
    current: JobAllocation = field(default_factory=JobAllocation)
    allocation_age_s: float | None = None
    """Seconds ``current`` has been in force; None: not tracked (no limit on how often it changes)."""
    since_event_s: float | None = None
    """Seconds since the node's job set last changed (an arrival or a departure); None: not tracked."""
    age_s: float | None = None
    """Seconds since the loop first saw the job (its first report); None: not tracked."""
    newly_modelled: bool = False
    """True at the one control step at which the job's model (M and loading curve) became
    known, having been unknown at an earlier step (controller/change_clock.py)."""
    departure_step: bool = False
    """True at the one control step at which another job's departure was seen: what it held
    is free, and the plan for the jobs left is made anew (controller/change_clock.py)."""
    max_workers: int | None = None
    """Most workers per rank that fit in the job's memory (controller/worker_memory.py); None: no limit known."""
    max_cores: float | None = None
    """Most cores the job can use where its scheduler placed it (a pod's CPU limit, a Slurm
    job's cpuset: controller/backends/base.Placement.cpu_limit); None: no limit known."""
    levers: frozenset[str] | None = None
    """The backend's capabilities that act on this job where its scheduler placed it
    ("cpu_quota", "cpu_weight", "cpuset", "read_bps"); None: all of them (a bare node).
    CPU weights act only between jobs with the same parent cgroup: where they do not
    reach every job, a policy plans with quotas instead."""
    unmanaged: bool = False
    """No loader of the job reports (controller/unmanaged.py): it has no loading curve and no
    workers to set; what it uses is its group's CPU (``cores_used``)."""


def cpu_controlled(job: JobView) -> bool:
    """A CPU weight or quota acts on the job where its scheduler placed it (not on a job left in
    a cgroup given no ``cpu`` controller, nor under the affinity backend)."""
    return job.levers is None or bool(job.levers & {"cpu_weight", "cpu_quota"})


def plan_by_quota(jobs: Sequence[JobView]) -> bool:
    """True when a CPU weight does not act on every job whose CPU is controlled (they do not all
    share one parent cgroup) but a quota does: a plan of cores is then enforced by quotas."""
    controlled = [job for job in jobs if cpu_controlled(job)]

    def acts(lever: str) -> bool:
        return all(job.levers is None or lever in job.levers for job in controlled)
    return bool(controlled) and not acts("cpu_weight") and acts("cpu_quota")


Allocation = Mapping[str, JobAllocation]


class Policy(Protocol):
    """Decides what each job gets. Must be pure: same inputs, same output."""

    name: str

    def allocate(self, node: NodeResources, jobs: Sequence[JobView]) -> Allocation:
        ...


def core_limit(node: NodeResources, job: JobView) -> float:
    """The most cores a policy may plan for ``job``: the node's, within what its scheduler lets it use."""
    return node.cores if job.max_cores is None else min(node.cores, job.max_cores)


def worker_limit(node: NodeResources, job: JobView) -> int:
    """The most workers per rank a policy may give ``job``: the node's cap, and what fits in
    the job's memory (at least one: a loader keeps one worker)."""
    limit = node.max_workers_per_job
    if job.max_workers is not None:
        limit = min(limit, max(1, job.max_workers))
    return limit


READER_WORKERS_PER_CORE = 2.0
"""Workers a core a reader is planned by adaptive and oracle (the bound it is measured against)."""


def workers_for_cores(cores: float, workers_per_core: float = 1.0, limit: int = 32) -> int:
    """DESIGN.md: workers follow cores, w = ceil(c·k), at least one, at most ``limit``."""
    return max(1, min(limit, math.ceil(cores * workers_per_core - 1e-9)))
