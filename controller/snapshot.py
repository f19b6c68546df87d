"""A read-only picture of the controller at one instant.

``adloader status``, the Prometheus collector and the benchmark read this and only
this, so none of them reaches into the controller's live objects. ``to_dict`` is
what the status reply carries over the socket.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from adloader.protocol import plain

JOB_STATES: tuple[str, ...] = ("starting", "running", "gone")
REALLOCATION_REASONS: tuple[str, ...] = ("arrival", "departure", "gain", "policy_change", "adoption", "safety_net")
ERROR_KINDS: tuple[str, ...] = (
    "too_long", "bad_encoding", "bad_json", "not_object", "bad_version", "unsupported_version",
    "unknown_type", "unknown_field", "missing_field", "bad_number", "bad_field", "internal",
    "already_registered", "backend_failed", "forbidden", "bad_policy", "unknown_job", "state_unwritable",
)
"""Known values of ``JobSnapshot.state``, of the keys of ``reallocations_total`` and of
``errors_total`` (the protocol's error codes plus the controller's). The exporter shows
every one from the start, at 0; a key not listed here still appears once counted."""


@dataclass(frozen=True)
class JobSnapshot:
    job_id: str
    name: str
    uid: int
    gpus: int
    state: str
    """"starting" (registered, no report yet), "running", or "gone" (being removed)."""
    launcher_pid: int
    pids: tuple[int, ...]
    cgroup: str
    registered_at: float
    """Unix time of registration."""
    ranks_reporting: int = 0
    batch_size: int | None = None
    cores: float | None = None
    cpu_weight: int | None = None
    cpus: tuple[int, ...] | None = None
    read_bps: int | None = None
    workers_target: int | None = None
    workers_running: int = 0
    """Sum over ranks of the workers each loader says it runs."""
    achieved_sps: float | None = None
    """Samples/s over the last window, all ranks."""
    max_sps_predicted: float | None = None
    max_sps_predicted_interval: tuple[float, float] | None = None
    max_sps_measured: float | None = None
    gpu_idle_ratio: float | None = None
    """1 - achieved/max, clipped to [0, 1]."""
    data_wait_ratio: float | None = None
    """Share of step time spent waiting for data over the last window."""
    samples_total: int = 0
    data_wait_seconds_total: float = 0.0
    compute_seconds_total: float = 0.0
    loader_cpu_seconds_total: float = 0.0
    read_bytes_total: int = 0
    cpu_seconds_total: float = 0.0
    """CPU time of the whole cgroup (cpuacct / cpu.stat)."""


@dataclass(frozen=True)
class NodeSnapshot:
    version: str
    policy: str
    backend: str
    started_at: float
    period_s: float
    cpus: tuple[int, ...]
    read_bps: float | None
    read_device: str | None
    jobs: tuple[JobSnapshot, ...] = ()
    connected_clients: int = 0
    last_loop_seconds: float = 0.0
    reallocations_total: dict[str, int] = field(default_factory=dict)
    """Reallocations by reason ("arrival", "departure", "gain", "policy_change", "adoption")."""
    errors_total: dict[str, int] = field(default_factory=dict)
    """Protocol and internal errors by kind (the error code)."""
    state_write_failures_total: int = 0
    state_corruptions_total: int = 0
    backend_failures_total: int = 0

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeSnapshot":
        """Rebuild from ``to_dict`` output (as ``adloader status`` receives it)."""
        jobs = tuple(_job_from_dict(j) for j in data.get("jobs", ()))
        values = {k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}}
        values["jobs"] = jobs
        values["cpus"] = tuple(values.get("cpus", ()))
        return cls(**values)


def _job_from_dict(data: dict[str, Any]) -> JobSnapshot:
    names = {f.name for f in dataclasses.fields(JobSnapshot)}
    values = {k: v for k, v in data.items() if k in names}
    for key in ("pids", "cpus", "max_sps_predicted_interval"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return JobSnapshot(**values)
