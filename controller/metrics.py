"""Prometheus exporter: ``/metrics`` for one node's controller.

A custom collector reads a :class:`~controller.snapshot.NodeSnapshot` at scrape
time, so what Prometheus sees is always what ``adloader status`` sees, a
finished job's series vanish with the job, and cardinality stays bounded by
the live jobs. Only the control-loop histogram keeps state of its own (it is
fed by :meth:`MetricsExporter.observe_loop`). Everything lives in a private
:class:`~prometheus_client.CollectorRegistry`, never the process-global one,
so two exporters in one process (tests) do not collide.

Names follow Prometheus's conventions: the ``adloader_`` prefix, base units
(seconds, bytes), ``_total`` on counters. Job series carry ``job_name`` and
``job_id`` (``job`` is Prometheus's own scrape-job label). docs/metrics.md lists
every metric; a test keeps that list and :data:`JOB_METRICS` in step.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Literal
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from adloader import __version__
from adloader.errors import AdloaderError
from controller.snapshot import ERROR_KINDS, JOB_STATES, REALLOCATION_REASONS, JobSnapshot, NodeSnapshot

log = logging.getLogger(__name__)

JOB_LABELS = ("job_name", "job_id")

LOOP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Control-loop duration buckets (seconds): a healthy loop takes milliseconds; the
top buckets catch a loop that eats a noticeable share of its period."""


class MetricsError(AdloaderError):
    """The exporter could not start (port taken, address not local)."""


@dataclass(frozen=True)
class JobMetric:
    """One per-job series: its name, type, help text and how to read it off a job.
    A ``value`` of None (not measured yet, no limit set) means no sample for that job."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    value: Callable[[JobSnapshot], float | None]


_MANAGED = {"running": 1.0, "unmanaged": 0.0}
"""adloader_job_managed by job state (absent for the others)."""

KERNEL_DEFAULT_CPU_WEIGHT = 100
"""cpu.weight of a group nobody weighted (v1: cpu.shares 1024); adloader status counts the same."""

JOB_METRICS: tuple[JobMetric, ...] = (
    JobMetric("adloader_job_gpus", "gauge", "GPUs the job holds on this node.", lambda j: j.gpus),
    JobMetric("adloader_job_managed", "gauge",
              "1: a loader of the job reports and adloader plans its loading; 0: unmanaged (no loader report past "
              "the grace period, or its loaders fell back: adloader_job_info's unmanaged_reason says why); absent "
              "while the job is starting.", lambda j: _MANAGED.get(j.state)),
    JobMetric("adloader_job_ranks_reporting", "gauge", "Ranks whose loader reported recently.",
              lambda j: j.ranks_reporting),
    JobMetric("adloader_job_registered_time_seconds", "gauge", "Unix time the job registered.",
              lambda j: j.registered_at),
    JobMetric("adloader_job_achieved_samples_per_second", "gauge",
              "Samples/s the job achieved over the last window, all ranks.", lambda j: j.achieved_sps),
    JobMetric("adloader_job_predicted_max_samples_per_second", "gauge",
              "Max samples/s predicted by the throughput model (data never stalls).",
              lambda j: j.max_sps_predicted),
    JobMetric("adloader_job_measured_max_samples_per_second", "gauge",
              "Max samples/s measured: batch / (step time - data wait).", lambda j: j.max_sps_measured),
    JobMetric("adloader_job_gpu_idle_ratio", "gauge", "1 - achieved/max samples/s, in [0, 1].",
              lambda j: j.gpu_idle_ratio),
    JobMetric("adloader_job_data_wait_ratio", "gauge",
              "Share of step time spent waiting for data over the last window.", lambda j: j.data_wait_ratio),
    JobMetric("adloader_job_cores", "gauge", "CPU cores given to the job (cgroup quota); absent when unlimited.",
              lambda j: j.cores),
    JobMetric("adloader_job_cpu_weight", "gauge",
              "CPU weight of the job's group (cgroup v2 cpu.weight scale; v1 cpu.shares = weight*1024/100): its "
              "share of contended CPUs, work-conserving. 100, the kernel's default, when the policy set none.",
              lambda j: j.cpu_weight if j.cpu_weight is not None else KERNEL_DEFAULT_CPU_WEIGHT),
    JobMetric("adloader_job_workers_target", "gauge", "DataLoader workers the controller asks for, all ranks.",
              lambda j: j.workers_target),
    JobMetric("adloader_job_workers_running", "gauge", "DataLoader workers the job's loaders say they run.",
              lambda j: j.workers_running),
    JobMetric("adloader_job_training_processes_apart", "gauge",
              "Ranks kept out of the job's CPU group, so that its weight and quota act on its loaders only.",
              lambda j: j.training_processes_apart),
    JobMetric("adloader_job_scheduler_cpu_limit_cores", "gauge",
              "Most cores the job's scheduler lets it use (a CPU quota on its cgroup or above, its cpuset's CPUs), "
              "which the policy plans within; absent where none is known.", lambda j: j.scheduler_cpu_limit),
    JobMetric("adloader_job_workers_memory_limit", "gauge",
              "Most DataLoader workers, all ranks, that fit in the job's memory limits and the node's reserve; "
              "absent until a worker is measured.", lambda j: j.workers_memory_limit),
    JobMetric("adloader_job_worker_memory_bytes", "gauge",
              "Memory one DataLoader worker costs, as the memory cap counts it: its own pages (USS) plus its share "
              "of the prefetched batches; an upper bound while adloader_job_worker_memory_exact is 0.",
              lambda j: j.worker_memory_bytes),
    JobMetric("adloader_job_worker_prefetch_bytes", "gauge",
              "Of a worker's memory, its share of the job's shared memory, where the prefetched batches live.",
              lambda j: j.worker_prefetch_bytes),
    JobMetric("adloader_job_worker_memory_exact", "gauge",
              "1: a worker's memory read exactly (smaps_rollup); 0: a cheap upper bound (its whole resident set), "
              "read while the job's memory holds twice the workers any policy gives.",
              lambda j: None if j.worker_memory_exact is None else float(j.worker_memory_exact)),
    JobMetric("adloader_job_read_bandwidth_limit_bytes_per_second", "gauge",
              "Read bandwidth limit on the node's data device; absent when unthrottled.", lambda j: j.read_bps),
    JobMetric("adloader_job_unapplied_limits", "gauge",
              "Limits the kernel refused at the last control step (the job keeps its previous ones; retried "
              "every period).", lambda j: len(j.failed_to_apply)),
    JobMetric("adloader_job_samples_total", "counter", "Samples the job's loaders delivered.",
              lambda j: j.samples_total),
    JobMetric("adloader_job_data_wait_seconds_total", "counter", "Seconds the training steps waited for data.",
              lambda j: j.data_wait_seconds_total),
    JobMetric("adloader_job_compute_seconds_total", "counter", "Seconds the training steps computed.",
              lambda j: j.compute_seconds_total),
    JobMetric("adloader_job_loader_cpu_seconds_total", "counter", "CPU seconds the loader workers used.",
              lambda j: j.loader_cpu_seconds_total),
    JobMetric("adloader_job_loader_load_seconds_total", "counter",
              "Wall seconds the loader workers spent loading batches; its rate is the batches loaded at once.",
              lambda j: j.loader_load_seconds_total),
    JobMetric("adloader_job_cpu_seconds_total", "counter", "CPU seconds the job's whole cgroup used.",
              lambda j: j.cpu_seconds_total),
    JobMetric("adloader_job_read_bytes_total", "counter", "Bytes the loader workers read from storage.",
              lambda j: j.read_bytes_total),
)


class SnapshotCollector(Collector):
    """Builds every series except the loop histogram from one snapshot per scrape."""

    def __init__(self, snapshot_fn: Callable[[], NodeSnapshot]) -> None:
        self._snapshot_fn = snapshot_fn

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot_fn()
        yield from _node_families(snapshot)
        yield from _job_families(snapshot.jobs)


def _job_families(jobs: tuple[JobSnapshot, ...]) -> Iterator[Metric]:
    info = InfoMetricFamily("adloader_job", "The job's state, owner, and why it is unmanaged (empty: it is not).",
                            labels=JOB_LABELS)
    for job in jobs:
        info.add_metric([job.name, job.job_id], {"state": job.state, "uid": str(job.uid),
                                                 "unmanaged_reason": job.unmanaged_reason or ""})
    yield info
    for spec in JOB_METRICS:
        family_type = GaugeMetricFamily if spec.kind == "gauge" else CounterMetricFamily
        family = family_type(spec.name, spec.help, labels=JOB_LABELS)
        for job in jobs:
            value = spec.value(job)
            if value is not None:
                family.add_metric([job.name, job.job_id], float(value))
        yield family


def _node_families(node: NodeSnapshot) -> Iterator[Metric]:
    yield InfoMetricFamily("adloader_build", "The controller's version.", value={"version": __version__})
    yield InfoMetricFamily(
        "adloader_node", "The node's policy, backend and throttled read device.",
        value={"policy": node.policy, "backend": node.backend, "read_device": node.read_device or ""},
    )
    yield GaugeMetricFamily("adloader_start_time_seconds", "Unix time the controller started.", value=node.started_at)
    yield GaugeMetricFamily("adloader_control_period_seconds", "Seconds between control-loop runs.",
                            value=node.period_s)
    yield GaugeMetricFamily("adloader_node_cores", "CPU cores the controller manages.", value=len(node.cpus))
    bandwidth = GaugeMetricFamily("adloader_node_read_bandwidth_bytes_per_second",
                                  "Read bandwidth the controller shares out; absent when it manages none.")
    if node.read_bps is not None:
        bandwidth.add_metric([], float(node.read_bps))
    yield bandwidth
    jobs = GaugeMetricFamily("adloader_node_jobs", "Jobs registered, by state.", labels=["state"])
    for state in _with_seen(JOB_STATES, (job.state for job in node.jobs)):
        jobs.add_metric([state], sum(1 for job in node.jobs if job.state == state))
    yield jobs
    yield GaugeMetricFamily("adloader_connected_clients", "Open connections on the controller socket.",
                            value=node.connected_clients)
    yield _labelled_counter("adloader_reallocations", "Allocation changes applied, by reason.", "reason",
                            REALLOCATION_REASONS, node.reallocations_total)
    yield _labelled_counter("adloader_errors", "Protocol and internal errors, by kind (the error code).", "kind",
                            ERROR_KINDS, node.errors_total)
    yield CounterMetricFamily("adloader_state_write_failures", "State-file writes that failed.",
                              value=node.state_write_failures_total)
    yield CounterMetricFamily("adloader_state_corruptions", "Corrupt state files found and moved aside.",
                              value=node.state_corruptions_total)
    yield CounterMetricFamily("adloader_backend_failures", "Changes the resource backend failed to apply.",
                              value=node.backend_failures_total)


def _labelled_counter(name: str, help_: str, label: str, known: tuple[str, ...], counts: dict[str, int]) -> Metric:
    """A counter with every known label value present (at 0 until it happens), plus any
    value the controller has counted that the list does not know yet."""
    family = CounterMetricFamily(name, help_, labels=[label])
    for key in _with_seen(known, counts):
        family.add_metric([key], float(counts.get(key, 0)))
    return family


def _with_seen(known: tuple[str, ...], seen: object) -> list[str]:
    extra = sorted(set(seen) - set(known))  # type: ignore[call-overload]
    return [*known, *extra]


class MetricsExporter:
    """Serves ``/metrics`` for the controller. ``snapshot_fn`` is called once per scrape
    from the HTTP server's thread, so it must be safe to call from another thread."""

    def __init__(self, snapshot_fn: Callable[[], NodeSnapshot]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SnapshotCollector(snapshot_fn))
        self._loop_duration = Histogram(
            "adloader_control_loop_duration_seconds",
            "Wall time of one control-loop iteration (measure, decide, apply).",
            buckets=LOOP_BUCKETS,
            registry=self.registry,
        )
        self._cpu_wait = Counter(
            "adloader_controller_cpu_wait_seconds",
            "Seconds the control loop was ready to run but waited for a CPU (run queue; controller/cpu_wait.py): "
            "growing by a large share of wall time, the controller is weighted far below its jobs and plans late.",
            registry=self.registry,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def observe_loop(self, seconds: float) -> None:
        """Record one control-loop iteration's duration."""
        self._loop_duration.observe(seconds)

    def observe_cpu_wait(self, seconds: float) -> None:
        """Count seconds the control loop waited for a CPU."""
        self._cpu_wait.inc(seconds)

    def start(self, address: str, port: int) -> int:
        """Listen on ``address:port`` (port 0 picks a free one) and return the bound port.
        Raises :class:`MetricsError` when the port cannot be bound."""
        if self._server is not None:
            raise MetricsError("the metrics exporter is already running; stop() it first")
        try:
            self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise MetricsError(
                f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}; "
                "choose another --metrics-port or --metrics-address"
            ) from None
        bound = int(self._server.server_address[1])
        log.info("serving Prometheus metrics on http://%s:%d/metrics", _host_for_url(address), bound)
        return bound

    def stop(self) -> None:
        """Stop serving and free the port. Safe to call when not started."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None


def _host_for_url(address: str) -> str:
    return f"[{address}]" if ":" in address else address
