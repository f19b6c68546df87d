"""The Prometheus exporter over a hand-built NodeSnapshot (the collector's real input type),
scraped over real HTTP and checked by the real promtool."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adloader import __version__
from controller.metrics import JOB_METRICS, MetricsError, MetricsExporter
from controller.snapshot import ERROR_KINDS, REALLOCATION_REASONS, JobSnapshot, NodeSnapshot

REPO = Path(__file__).resolve().parent.parent


def _job(job_id: str, name: str, state: str = "running", **values: object) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id, name=name, uid=1000, gpus=2, state=state, launcher_pid=4242, pids=(4242, 4243),
        cgroup=f"/sys/fs/cgroup/cpu/adloader/{job_id}", registered_at=1_700_000_000.0, **values,
    )


def _node(*jobs: JobSnapshot, **values: object) -> NodeSnapshot:
    return NodeSnapshot(
        version=__version__, policy="adaptive", backend="cgroup-v1", started_at=1_700_000_000.0, period_s=1.0,
        cpus=(0, 1, 2, 3), read_bps=200e6, read_device="254:0", jobs=jobs, **values,
    )


RESNET = _job(
    "j-1", "resnet50", ranks_reporting=2, batch_size=64, cores=2.5, read_bps=50_000_000, workers_target=6,
    workers_running=5, achieved_sps=410.0, max_sps_predicted=520.0, max_sps_measured=500.0, gpu_idle_ratio=0.18,
    data_wait_ratio=0.2, samples_total=12800, data_wait_seconds_total=7.5, compute_seconds_total=30.0,
    loader_cpu_seconds_total=55.0, loader_load_seconds_total=21.0, read_bytes_total=3_000_000_000,
    cpu_seconds_total=60.0, scheduler_cpu_limit=3.0, workers_memory_limit=9, worker_memory_bytes=250 * 2**20, worker_prefetch_bytes=16 * 2**20,
    worker_memory_exact=True,
    failed_to_apply={"cpus": "cpuset.cpus: Invalid argument"},
)
BERT = _job("j-2", "bert", state="starting")  # registered, nothing measured yet


class Scraper:
    """A running exporter whose snapshot the test can swap between scrapes."""

    def __init__(self, snapshot: NodeSnapshot) -> None:
        self.snapshot = snapshot
        self.exporter = MetricsExporter(lambda: self.snapshot)
        self.port = self.exporter.start("127.0.0.1", 0)

    def text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
            return reply.read().decode()

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(self.text())
            for s in family.samples
        }


@pytest.fixture
def scraper() -> Iterator[Scraper]:
    s = Scraper(_node(RESNET, BERT, connected_clients=3, reallocations_total={"arrival": 2},
                      errors_total={"bad_json": 1, "not_yet_listed": 4}, backend_failures_total=1))
    yield s
    s.exporter.stop()


def _job_value(samples: dict, name: str, job_id: str) -> float | None:
    for (sample_name, labels), value in samples.items():
        if sample_name == name and ("job_id", job_id) in labels:
            return value
    return None


def test_every_job_field_is_exported_with_its_value_and_both_job_labels(scraper: Scraper) -> None:
    samples = scraper.samples()
    key = lambda name: (name, (("job_id", "j-1"), ("job_name", "resnet50")))  # noqa: E731
    assert samples[key("adloader_job_achieved_samples_per_second")] == 410.0
    assert samples[key("adloader_job_predicted_max_samples_per_second")] == 520.0
    assert samples[key("adloader_job_measured_max_samples_per_second")] == 500.0
    assert samples[key("adloader_job_gpu_idle_ratio")] == 0.18
    assert samples[key("adloader_job_cores")] == 2.5
    assert samples[key("adloader_job_workers_target")] == 6
    assert samples[key("adloader_job_workers_running")] == 5
    assert samples[key("adloader_job_read_bandwidth_limit_bytes_per_second")] == 50e6
    assert samples[key("adloader_job_data_wait_seconds_total")] == 7.5
    assert samples[key("adloader_job_read_bytes_total")] == 3e9
    assert samples[key("adloader_job_loader_load_seconds_total")] == 21.0
    assert samples[key("adloader_job_samples_total")] == 12800
    assert samples[key("adloader_job_unapplied_limits")] == 1
    assert samples[key("adloader_job_workers_memory_limit")] == 9
    assert samples[key("adloader_job_scheduler_cpu_limit_cores")] == 3.0
    assert samples[key("adloader_job_worker_memory_bytes")] == 250 * 2**20
    assert samples[key("adloader_job_worker_prefetch_bytes")] == 16 * 2**20
    assert samples[key("adloader_job_worker_memory_exact")] == 1
    for spec in JOB_METRICS:
        assert _job_value(samples, spec.name, "j-1") == spec.value(RESNET), spec.name


def test_unmeasured_job_values_are_absent_not_zero_while_its_counters_start_at_zero(scraper: Scraper) -> None:
    samples = scraper.samples()
    assert _job_value(samples, "adloader_job_achieved_samples_per_second", "j-2") is None
    assert _job_value(samples, "adloader_job_cores", "j-2") is None
    assert _job_value(samples, "adloader_job_gpu_idle_ratio", "j-2") is None
    assert _job_value(samples, "adloader_job_worker_memory_bytes", "j-2") is None
    assert _job_value(samples, "adloader_job_worker_memory_exact", "j-2") is None
    assert _job_value(samples, "adloader_job_scheduler_cpu_limit_cores", "j-2") is None
    assert _job_value(samples, "adloader_job_data_wait_seconds_total", "j-2") == 0
    assert _job_value(samples, "adloader_job_samples_total", "j-2") == 0
    assert samples[("adloader_job_info", (("job_id", "j-2"), ("job_name", "bert"), ("state", "starting"),
                                          ("uid", "1000"), ("unmanaged_reason", "")))] == 1
    assert _job_value(samples, "adloader_job_managed", "j-2") is None  # starting: not known yet


def test_an_unmanaged_job_says_so_and_why_and_a_managed_one_says_it_is(scraper: Scraper) -> None:
    why = "loader fell back to torch's (in_order=False)"
    scraper.snapshot = _node(RESNET, _job("j-3", "dali", state="unmanaged", unmanaged_reason=why))
    samples = scraper.samples()
    assert _job_value(samples, "adloader_job_managed", "j-1") == 1
    assert _job_value(samples, "adloader_job_managed", "j-3") == 0
    assert samples[("adloader_job_info", (("job_id", "j-3"), ("job_name", "dali"), ("state", "unmanaged"),
                                          ("uid", "1000"), ("unmanaged_reason", why)))] == 1


def test_node_series_and_every_known_reason_and_error_kind_exist_from_the_start(scraper: Scraper) -> None:
    samples = scraper.samples()
    assert samples[("adloader_node_cores", ())] == 4
    assert samples[("adloader_node_read_bandwidth_bytes_per_second", ())] == 200e6
    assert samples[("adloader_connected_clients", ())] == 3
    assert samples[("adloader_node_jobs", (("state", "running"),))] == 1
    assert samples[("adloader_node_jobs", (("state", "starting"),))] == 1
    assert samples[("adloader_node_jobs", (("state", "gone"),))] == 0
    assert samples[("adloader_build_info", (("version", __version__),))] == 1
    assert samples[("adloader_backend_failures_total", ())] == 1
    assert samples[("adloader_state_write_failures_total", ())] == 0
    assert samples[("adloader_state_corruptions_total", ())] == 0
    for reason in REALLOCATION_REASONS:
        assert samples[("adloader_reallocations_total", (("reason", reason),))] == (2 if reason == "arrival" else 0)
    for kind in ERROR_KINDS:
        assert samples[("adloader_errors_total", (("kind", kind),))] == (1 if kind == "bad_json" else 0)
    assert samples[("adloader_errors_total", (("kind", "not_yet_listed"),))] == 4  # counted, though not listed
    assert samples[("adloader_control_loop_duration_seconds_count", ())] == 0


def test_a_finished_jobs_series_vanish_with_it(scraper: Scraper) -> None:
    assert _job_value(scraper.samples(), "adloader_job_cores", "j-1") == 2.5
    scraper.snapshot = _node(BERT)
    samples = scraper.samples()
    assert not [name for name, labels in samples if ("job_id", "j-1") in labels]
    assert _job_value(samples, "adloader_job_samples_total", "j-2") == 0


def test_series_count_grows_with_live_jobs_only(scraper: Scraper) -> None:
    def job_series(snapshot: NodeSnapshot) -> int:
        scraper.snapshot = snapshot
        return sum(1 for _, labels in scraper.samples() if any(k == "job_id" for k, _ in labels))

    many = [_job(f"j-{i}", f"job{i}", cores=1.0) for i in range(50)]
    assert job_series(_node(*many)) == 50 * job_series(_node(many[0]))
    assert job_series(_node()) == 0


def test_control_loop_durations_land_in_the_histogram(scraper: Scraper) -> None:
    for seconds in (0.0004, 0.003, 0.003, 0.2):
        scraper.exporter.observe_loop(seconds)
    samples = scraper.samples()
    assert samples[("adloader_control_loop_duration_seconds_count", ())] == 4
    assert samples[("adloader_control_loop_duration_seconds_sum", ())] == pytest.approx(0.2064)
    assert samples[("adloader_control_loop_duration_seconds_bucket", (("le", "0.0005"),))] == 1
    assert samples[("adloader_control_loop_duration_seconds_bucket", (("le", "0.005"),))] == 3
    assert samples[("adloader_control_loop_duration_seconds_bucket", (("le", "+Inf"),))] == 4


def test_the_controllers_cpu_wait_is_counted(scraper: Scraper) -> None:
    assert scraper.samples()[("adloader_controller_cpu_wait_seconds_total", ())] == 0
    for seconds in (0.25, 0.0, 1.5):
        scraper.exporter.observe_cpu_wait(seconds)
    assert scraper.samples()[("adloader_controller_cpu_wait_seconds_total", ())] == pytest.approx(1.75)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (./install.sh --test installs it)")
def test_promtool_finds_nothing_to_complain_about_in_a_scrape(scraper: Scraper) -> None:
    scraper.exporter.observe_loop(0.01)
    check = subprocess.run(["promtool", "check", "metrics"], input=scraper.text(), capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check.stdout + check.stderr


def test_stop_frees_the_port_and_a_taken_port_is_a_clear_error() -> None:
    first = Scraper(_node())
    try:
        with pytest.raises(MetricsError, match=f"127.0.0.1:{first.port}.*--metrics-port"):
            MetricsExporter(lambda: _node()).start("127.0.0.1", first.port)
    finally:
        first.exporter.stop()
    with socket.create_server(("127.0.0.1", first.port)):  # bindable again: the port was freed
        pass
    first.exporter.stop()  # a second stop is harmless


def test_docs_list_every_exported_metric_with_its_type(scraper: Scraper) -> None:
    documented = dict(re.findall(r"^\| `(adloader_[a-z_]+)` \| (gauge|counter|histogram) \|",
                                 (REPO / "docs" / "metrics.md").read_text(), re.M))
    exported = {
        f"{family.name}_total" if family.type == "counter" else family.name: family.type
        for family in text_string_to_metric_families(scraper.text())
        if not family.name.endswith("_created")  # prometheus-client's own extra series
    }
    assert documented == exported
