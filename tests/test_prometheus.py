"""The exporter, the shipped scrape config and the dashboard against a real Prometheus.

One stack for the module: a real controller (cgroup v1, read bandwidth managed) with its
exporter on a free loopback port, two real jobs under ``adloader run`` that report like
a loader (tests/reporting_job.py: real reads and hashing, GPU-emulated compute), and
Debian's Prometheus scraping twice a second with grafana/prometheus/prometheus.yml (only
the targets and intervals changed). Every query of every dashboard panel, template
variable and annotation then goes through Prometheus's HTTP API.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from controller.backends.blockdev import read_device_of
from bench.controller_process import REPO, Cleanup, ControllerProcess, base_environment, wait_until
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1

DASHBOARD = REPO / "grafana" / "dashboards" / "adloader.json"
SCRAPE_CONFIG = REPO / "grafana" / "prometheus" / "prometheus.yml"
JOB_NAMES = ("prom-alpha", "prom-beta")
SCRAPE_INTERVAL = "500ms"
RATE_INTERVAL = "5s"
ANNOTATION_INTERVAL = "1m"

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Prometheus server and promtool not installed (./install.sh --test installs Debian's prometheus)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read()


@dataclass
class Stack:
    controller: ControllerProcess
    metrics_url: str
    prometheus_url: str

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful reply (AssertionError otherwise)."""
        url = f"{self.prometheus_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(_get(url))
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]


def _prometheus_config(metrics_port: int) -> dict[str, Any]:
    """The shipped config with only the targets and the intervals changed for a test."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"].update(scrape_interval=SCRAPE_INTERVAL, evaluation_interval=SCRAPE_INTERVAL)
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "adloader"]
    job.update(scrape_interval=SCRAPE_INTERVAL, scrape_timeout=SCRAPE_INTERVAL,
               static_configs=[{"targets": [f"127.0.0.1:{metrics_port}"]}])
    return config


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    if not CGROUP_V1_USABLE:
        pytest.skip(NO_CGROUP_V1)
    if shutil.which("prometheus") is None:
        pytest.skip("Prometheus server not installed (./install.sh --test installs Debian's prometheus)")
    cleanup = Cleanup()
    workdir = Path(tempfile.mkdtemp(prefix="adl-prom-", dir="/tmp"))
    cleanup.directories.append(workdir)
    prometheus: subprocess.Popen | None = None
    try:
        metrics_port = _free_port()
        controller = cleanup.new_controller(
            ("--policy", "even", "--metrics-port", str(metrics_port),
             "--read-device", read_device_of(workdir), "--read-bps", "100000000"),
            0.5, base_environment(),
        ).start()
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(metrics_port)))
        prometheus_url = f"http://127.0.0.1:{_free_port()}"
        with (workdir / "prometheus.log").open("w") as log:
            prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={prometheus_url.removeprefix('http://')}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        s = Stack(controller, f"http://127.0.0.1:{metrics_port}/metrics", prometheus_url)
        wait_until(lambda: _ready(s, prometheus, workdir), 30, "Prometheus to scrape the controller")
        # Real loaders with a worker each, so every per-job panel has its series (the workers
        # memory holds is known once a worker is measured).
        job = [sys.executable, str(REPO / "tests" / "loader_job.py"), "--seconds", "120", "--workers", "1",
               "--out", str(workdir / "out")]
        first = controller.run(*job, name=JOB_NAMES[0], options=("--gpus", "2"))
        controller.registered(first)
        # Let Prometheus see the first job's allocation before the second one changes it,
        # so the core-change annotation has a change to show.
        wait_until(lambda: s.query(f'adloader_job_cores{{job_name="{JOB_NAMES[0]}"}}'), 20, "the first job's cores")
        controller.registered(controller.run(*job, name=JOB_NAMES[1], options=("--gpus", "1")))
        wait_until(lambda: len(s.query(f"rate(adloader_job_samples_total[{RATE_INTERVAL}]) > 0")) == 2
                   and len(s.query(f"changes(adloader_job_cores[{ANNOTATION_INTERVAL}]) > 0")) >= 1,
                   30, "two scrapes of both jobs' reports and the first job's core change")
        yield s
    finally:
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(10)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait()
        cleanup.run()


def _ready(stack: Stack, prometheus: subprocess.Popen, workdir: Path) -> bool:
    if prometheus.poll() is not None:
        raise AssertionError(f"prometheus exited with {prometheus.returncode}: "
                             f"{(workdir / 'prometheus.log').read_text()[-2000:]}")
    try:
        return bool(stack.query('up{job="adloader"} == 1'))
    except (OSError, AssertionError):
        return False


# ---------------------------------------------------------------- the dashboard's queries


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _panel_queries() -> list[Any]:
    return [pytest.param(f"{panel['title']} / {target['refId']}", target["expr"],
                         id=f"{panel['title']}/{target['refId']}")
            for panel in _panels(_dashboard()["panels"]) for target in panel.get("targets", [])]


def _annotation_queries() -> list[Any]:
    return [pytest.param(a["name"], a["expr"], id=a["name"]) for a in _dashboard()["annotations"]["list"] if "expr" in a]


def _substitute(expr: str) -> str:
    """What Grafana sends with every selector at All and this test's scrape interval."""
    values = {"instance": ".*", "job_name": ".*", "__rate_interval": RATE_INTERVAL, "__interval": ANNOTATION_INTERVAL}
    substituted = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
    assert "$" not in substituted, substituted
    return substituted


def test_the_dashboard_has_the_panels_an_operator_needs() -> None:
    titles = {panel["title"] for panel in _panels(_dashboard()["panels"])}
    assert {"GPU idle", "Achieved vs max throughput", "Data wait share", "CPU cores: given vs used",
            "DataLoader workers", "Read bandwidth: limit vs read", "Loader CPU used vs cores managed",
            "Control loop duration", "Controller health", "Reallocations", "Jobs: managed or not, and why"} <= titles
    variables = {v["name"] for v in _dashboard()["templating"]["list"]}
    assert variables == {"datasource", "instance", "job_name"}


@needs_prometheus
@pytest.mark.parametrize("where, expr", _panel_queries())
def test_every_panel_query_returns_series_for_both_jobs(stack: Stack, where: str, expr: str) -> None:
    result = stack.query(_substitute(expr))
    assert result, f"{where}: no series for {expr}"
    instances = {series["metric"].get("instance") for series in result}
    assert "127.0.0.1" in instances, f"{where}: instance label {instances} (the shipped relabelling strips the port)"
    if "job_name" in expr:
        names = {series["metric"].get("job_name") for series in result}
        assert set(JOB_NAMES) <= names, f"{where}: series only for {names}"
    for series in result:
        value = float(series["value"][1])
        assert value == value, f"{where}: NaN for {series['metric']}"  # NaN != NaN


@needs_prometheus
@pytest.mark.parametrize("name, expr", _annotation_queries())
def test_every_annotation_query_marks_the_reallocations_that_happened(stack: Stack, name: str, expr: str) -> None:
    assert stack.query(_substitute(expr)), f"annotation {name}: nothing marked although both jobs arrived"


@needs_prometheus
def test_the_template_variables_list_the_node_and_both_jobs(stack: Stack) -> None:
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
        assert match, variable["definition"]
        selector, label = _substitute(match.group(1)), match.group(2)
        values = set(stack.api(f"label/{label}/values", **{"match[]": selector}))
        assert (set(JOB_NAMES) if label == "job_name" else {"127.0.0.1"}) <= values, (label, values)


@needs_prometheus
def test_promtool_check_metrics_is_clean_on_a_scrape_of_the_real_controller(stack: Stack) -> None:
    scrape = _get(stack.metrics_url).decode()
    assert all(f'job_name="{name}"' in scrape for name in JOB_NAMES)
    check = subprocess.run(["promtool", "check", "metrics"], input=scrape, capture_output=True, text=True)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


@needs_prometheus
def test_the_shipped_scrape_config_passes_promtool() -> None:
    check = subprocess.run(["promtool", "check", "config", str(SCRAPE_CONFIG)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
