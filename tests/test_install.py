"""From a clone to a server and back: ``install.sh --system`` makes a venv, the command every
user runs and the systemd unit; the unit's command line starts a real controller that
manages a real job; ``install.sh --uninstall`` refuses while that controller runs, and
once it has stopped, lifts every limit and removes every group, the job still running.

The install goes to temporary paths (``ADLOADER_PREFIX`` and friends) and pip may not
reach any index (``PIP_NO_INDEX``): nothing is downloaded, torch above all. Run from a venv
(whose torch the system's Python lacks), the server venv is given the venv's torch. systemd is
not needed: where it does not run, the test starts the unit's ExecStart itself, with the
environment the unit would give it.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from bench.controller_process import CGROUP_ROOT, HIERARCHIES, REPO, cgroup_of, remove_group, wait_until
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1
from test_deploy import _unit_entries, _unit_value

pytestmark = pytest.mark.slow


@pytest.fixture
def layout() -> Iterator[dict[str, Path]]:
    if not CGROUP_V1_USABLE:
        pytest.skip(NO_CGROUP_V1)
    top = Path(tempfile.mkdtemp(prefix="adl-install-", dir="/tmp"))
    os.chmod(top, 0o755)
    paths = {"prefix": top / "opt" / "adloader", "bin": top / "bin", "units": top / "units",
             "config": top / "etc" / "adloader", "run": top / "run", "state": top / "state"}
    group = f"adloader-test-{uuid.uuid4().hex[:8]}"
    paths["group"] = Path(group)
    yield paths
    remove_group(group)
    subprocess.run(["rm", "-rf", str(top)], check=False)


def _install_sh(layout: dict[str, Path], *args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ADLOADER_", "PYTHON"))}
    environ.update(ADLOADER_PREFIX=str(layout["prefix"]), ADLOADER_BIN_DIR=str(layout["bin"]),
                   ADLOADER_UNIT_DIR=str(layout["units"]), ADLOADER_CONFIG=str(layout["config"]),
                   PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHON=sys.executable)
    return subprocess.run([str(REPO / "install.sh"), *args], capture_output=True, text=True, timeout=600,
                          env=environ, cwd="/")


def _unit_command(unit: Path, config: Path) -> list[str]:
    """The unit's ExecStart as systemd would run it: Environment= defaults, then the EnvironmentFile."""
    entries = _unit_entries(unit.read_text())
    values = dict(v.split("=", 1) for s, k, v in entries if (s, k) == ("Service", "Environment"))
    for line in config.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    exec_start = _unit_value(entries, "Service", "ExecStart")
    words = []
    for word in shlex.split(exec_start):
        if re.fullmatch(r"\$(\w+)", word):  # $VAR: split into words, as systemd does
            words += shlex.split(values[word[1:]])
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], word))
    return words


def test_system_install_serves_jobs_and_uninstall_leaves_no_group(layout: dict[str, Path]) -> None:
    installed = _install_sh(layout, "--system")
    output = installed.stdout + installed.stderr
    assert installed.returncode == 0, output
    assert "Downloading" not in output and "Collecting torch" not in output
    command = layout["bin"] / "adloader"
    assert os.readlink(command) == str(layout["prefix"] / "bin" / "adloader")
    probe = subprocess.run([str(layout["prefix"] / "bin" / "python"), "-c",
                            "import adloader, controller, launcher, torch; print(adloader.__file__)"],
                           capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert probe.stdout.startswith(str(layout["prefix"])), probe  # the venv's copy, not the clone's
    unit = layout["units"] / "adloader-controller.service"
    argv = _unit_command(unit, layout["config"])
    assert argv[:2] == [str(layout["prefix"] / "bin" / "adloader"), "controller"]

    group = str(layout["group"])
    socket = layout["run"] / "adloader.sock"
    layout["config"].write_text(
        f'ADLOADER_OPTS="--socket {socket} --state-dir {layout["state"]} --cgroup-group {group} '
        '--policy even --cpus 0"\nADLOADER_METRICS_PORT=0\n')
    controller = subprocess.Popen(_unit_command(unit, layout["config"]), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd="/", start_new_session=True)
    job = None
    try:
        environ = {"PATH": "/usr/bin:/bin"}
        wait_until(lambda: subprocess.run([str(command), "status", "--socket", str(socket)], capture_output=True,
                                          env=environ, timeout=30).returncode == 0, 60, "the controller to answer")
        job = subprocess.Popen([str(command), "run", "--socket", str(socket), "--name", "served", "--", "sleep", "300"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ, cwd="/",
                               start_new_session=True)
        job_dir = wait_until(lambda: next((d for d in (CGROUP_ROOT / "cpu" / group).glob("j*")
                                           if (d / "cpu.cfs_quota_us").read_text().strip() != "-1"), None),
                             30, "the job's group with its quota")
        assert job.pid in {int(p) for p in (job_dir / "cgroup.procs").read_text().split()}

        refused = _install_sh(layout, "--uninstall")
        assert refused.returncode == 1
        assert f"already managed by controller pid {controller.pid}" in refused.stderr, refused.stderr
        assert command.exists() and unit.exists() and job_dir.exists()

        controller.send_signal(signal.SIGTERM)  # what systemctl stop does
        assert controller.wait(30) == 0
        removed = _install_sh(layout, "--uninstall")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert f"removed 1 job group(s) and the cgroup-v1 group '{group}'" in removed.stderr
        for hierarchy in HIERARCHIES:
            assert not (CGROUP_ROOT / hierarchy / group).exists(), hierarchy
            assert cgroup_of(job.pid, hierarchy) == "/", hierarchy  # back in the root: no limit of ours
        assert job.poll() is None  # the job kept running
        assert not command.exists() and not unit.exists() and not layout["prefix"].exists()
        assert layout["config"].exists()  # kept without --purge
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
        if job is not None:
            job.kill()
            job.wait()


def test_install_sh_ends_no_process_at_all() -> None:
    """It keeps the daemons it installs from starting (below), so it has none to end: not one
    kill command, by PID or otherwise, may creep in."""
    assert "kill" not in (REPO / "install.sh").read_text()


def _apt_install_without_starting(tmp_path: Path, policy: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """install.sh's apt_install_without_starting, run alone, with a fake apt-get whose install does what a
    package's maintainer script does (asks policy-rc.d whether it may start its daemon, and starts one, a
    sleep, when allowed) and a fake systemctl that records what it is asked. Returns the run and the log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(
        '#!/bin/sh\n[ "$1" = update ] && exit 0\n'
        f'if "$ADLOADER_POLICY_RC" prometheus start; then sleep 300 >/dev/null 2>&1 & echo "started $!" >> {log}; '
        f'else echo "refused $?" >> {log}; fi\n')
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "systemctl $*" >> {log}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = ('set -euo pipefail; POLICY_RC=$ADLOADER_POLICY_RC\n'
              'eval "$(sed -n "/^apt_install_without_starting()/,/^}/p" install.sh)"\n'
              'apt_install_without_starting "prometheus" prometheus\n')
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ADLOADER_POLICY_RC": str(policy)})
    return run, log.read_text().splitlines()


def test_packages_installed_for_the_tests_start_no_daemon_and_the_policy_goes_afterwards(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    run, calls = _apt_install_without_starting(tmp_path, policy)
    assert run.returncode == 0, run.stderr
    assert calls == ["refused 101"]  # nothing started, so nothing to stop
    assert not policy.exists()


def test_a_policy_the_machine_has_decides_and_only_the_service_manager_stops_what_started(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 0\n")
    policy.chmod(0o755)
    run, calls = _apt_install_without_starting(tmp_path, policy)
    started = int(calls[0].split()[1])
    os.kill(started, signal.SIGTERM)  # the fake daemon this test's apt-get started
    assert run.returncode == 0, run.stderr
    assert calls == [f"started {started}", "systemctl stop prometheus"]
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"
