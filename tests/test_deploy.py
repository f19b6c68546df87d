"""The deployment files say what they mean: each parses, `systemd-analyze verify` accepts
the unit, every adloader command line in them parses with adloader's own argument
parsers, and the pieces that must agree (socket path, ports, labels, mounts) agree."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from adloader.cli import SUBCOMMANDS, _top_parser, split_command

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "adloader-controller.service"


def _adloader_args(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """Parse ``argv`` (what follows the ``adloader`` executable) as the CLI would."""
    head, rest = split_command(argv)
    command = _top_parser().parse_args(head).command
    parser = argparse.ArgumentParser(prog=f"adloader {command}")
    importlib.import_module(SUBCOMMANDS[command][0]).configure(parser)
    return command, parser.parse_args(rest)


# ---------------------------------------------------------------- systemd


def _unit_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in order, continuation lines joined, as systemd reads them."""
    entries, section = [], ""
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def _unit_value(entries: list[tuple[str, str, str]], section: str, key: str) -> str:
    (value,) = [v for s, k, v in entries if (s, k) == (section, key)]
    return value


def test_the_unit_delegates_cgroups_restarts_on_failure_and_spares_the_jobs() -> None:
    entries = _unit_entries(UNIT.read_text())
    assert _unit_value(entries, "Service", "Delegate") == "yes"
    assert _unit_value(entries, "Service", "Restart") == "on-failure"
    assert _unit_value(entries, "Service", "KillMode") == "process"
    assert _unit_value(entries, "Install", "WantedBy") == "multi-user.target"


def test_the_units_command_line_parses_and_matches_its_directories() -> None:
    entries = _unit_entries(UNIT.read_text())
    defaults = dict(v.split("=", 1) for s, k, v in entries if (s, k) == ("Service", "Environment"))
    exec_start = _unit_value(entries, "Service", "ExecStart")
    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults[m.group(1) or m.group(2)], exec_start)
    executable, *argv = shlex.split(expanded)
    assert executable == "/opt/adloader/bin/adloader"  # the venv install.sh --system makes
    command, args = _adloader_args(argv)
    assert command == "controller"
    runtime_dir = Path("/run") / _unit_value(entries, "Service", "RuntimeDirectory")
    state_dir = Path("/var/lib") / _unit_value(entries, "Service", "StateDirectory")
    assert args.socket.parent == runtime_dir and args.state_dir == state_dir
    assert (args.metrics_address, args.metrics_port) == ("0.0.0.0", 9477)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at a real adloader entry point.
    program = tmp_path / "adloader"
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m adloader \"$@\"\n")
    program.chmod(0o755)
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/adloader/bin/adloader", str(program)))
    check = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


# ---------------------------------------------------------------- Kubernetes


def _documents(name: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if doc}


def _controller_pod() -> tuple[dict[str, Any], dict[str, Any], argparse.Namespace]:
    daemonset = _documents("daemonset.yaml")["DaemonSet"]
    pod = daemonset["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command, args = _adloader_args(container["args"])
    assert command == "controller"
    return daemonset, container, args


def _host_path_mounted_at(pod_spec: dict[str, Any], container: dict[str, Any], path: str) -> str:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == mount["name"]]
    return volume["hostPath"]["path"]


def test_the_daemonset_shares_the_host_pid_namespace_cgroups_socket_and_state() -> None:
    daemonset, container, args = _controller_pod()
    pod = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["hostPID"] is True and container["securityContext"]["privileged"] is True
    assert _host_path_mounted_at(pod["spec"], container, "/sys/fs/cgroup") == "/sys/fs/cgroup"
    assert _host_path_mounted_at(pod["spec"], container, str(args.socket.parent)) == "/run/adloader"
    assert _host_path_mounted_at(pod["spec"], container, str(args.state_dir)) == "/var/lib/adloader"
    assert args.metrics_address == "0.0.0.0"
    (port,) = container["ports"]
    assert port["containerPort"] == args.metrics_port == int(pod["metadata"]["annotations"]["prometheus.io/port"])
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_the_service_monitor_finds_the_daemonsets_pods_and_port() -> None:
    daemonset, container, _ = _controller_pod()
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    docs = _documents("servicemonitor.yaml")
    service, monitor = docs["Service"], docs["ServiceMonitor"]
    namespace = daemonset["metadata"]["namespace"]
    assert service["metadata"]["namespace"] == namespace
    assert namespace in monitor["spec"]["namespaceSelector"]["matchNames"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == container["ports"][0]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "adloader"  # the dashboard's up{job=...}


def test_the_example_training_pod_reaches_the_controllers_socket() -> None:
    _, _, controller_args = _controller_pod()
    job = _documents("training-job-example.yaml")["Job"]
    pod_spec = job["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    environ = {e["name"]: e["value"] for e in container["env"]}
    socket = Path(environ["ADLOADER_SOCKET"])
    assert _host_path_mounted_at(pod_spec, container, str(socket.parent)) == "/run/adloader"
    assert socket.name == controller_args.socket.name
    executable, *argv = container["command"]
    command, args = _adloader_args(argv)
    assert (executable, command) == ("adloader", "run") and args.command[:2] == ["--", "torchrun"]


# ---------------------------------------------------------------- Slurm and Grafana


def test_the_slurm_job_script_is_valid_bash_and_runs_torchrun_under_adloader_run() -> None:
    script = DEPLOY / "slurm" / "adloader-job.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    (line,) = [line for line in re.sub(r"\\\n", " ", script.read_text()).splitlines() if line.startswith("srun ")]
    example = {"SLURM_JOB_NAME": "resnet50", "GPUS_PER_NODE": "8", "SLURM_JOB_NUM_NODES": "2",
               "MASTER_ADDR": "gpu-01", "SLURM_JOB_ID": "4242"}
    words = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: example[m.group(1)], line))
    command, args = _adloader_args(words[words.index("adloader") + 1:])
    assert command == "run" and (args.name, args.gpus) == ("resnet50", 8)
    assert args.command[:2] == ["--", "torchrun"] and args.command[-1] == "train.py"


def test_grafana_provisioning_points_at_prometheus_and_the_shipped_dashboard() -> None:
    datasources = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "adloader.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
    providers = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "adloader.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    dashboard = json.loads((REPO / "grafana" / "dashboards" / "adloader.json").read_text())
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == source["type"]
