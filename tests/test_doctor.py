"""``adloader doctor``: each check on real roots where the machine has them (the v1 mounts, /proc,
a running controller, this Python's torch) and on fixture trees for what it lacks (cgroup v2
layouts, Slurm and kubelet processes, an NVIDIA driver, a node short of memory)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.controller_process import REPO, ControllerProcess, base_environment
from controller.doctor import (
    FAIL, OK, WARN, Finding, NodeRoots, check_cgroups, check_controller, check_memory_reserve, check_read_device,
    check_scheduler, check_throughput_model, check_torch, check_write_access, exit_status,
)
from controller.doctor_cli import render
from controller.node_memory import CORPUS_FILE
from fixtures.cgroup2_tree import make_group
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1
from throughput_model.corpus import load_corpus

needs_v1 = pytest.mark.skipif(not CGROUP_V1_USABLE, reason=NO_CGROUP_V1)


def _proc(root: Path, processes: dict[int, tuple[str, str]], meminfo: str = "") -> Path:
    """A /proc with ``pid -> (command name, /proc/PID/cgroup text)`` and a meminfo."""
    root.mkdir(parents=True, exist_ok=True)
    for pid, (comm, cgroup) in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "cgroup").write_text(cgroup)
    (root / "meminfo").write_text(meminfo or "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")
    return root


def _v2_node(tmp_path: Path, controllers: str, delegated: str = "") -> NodeRoots:
    """A cgroup v2 mount where this "launcher" (pid 4242) sits in a systemd service."""
    cgroup = tmp_path / "cgroup"
    make_group(cgroup, controllers, cgroup__subtree_control=controllers)
    make_group(cgroup / "system.slice", controllers, cgroup__subtree_control=controllers)
    make_group(cgroup / "system.slice" / "train.service", controllers, cgroup__subtree_control=delegated)
    proc = _proc(tmp_path / "proc", {4242: ("python3", "0::/system.slice/train.service\n")})
    return NodeRoots(cgroup=cgroup, proc=proc, sys=tmp_path / "sys", pid=4242)


@needs_v1
def test_the_real_v1_mounts_are_ok_and_writable(tmp_path: Path) -> None:
    cgroups = check_cgroups(NodeRoots(), "adloader")
    assert cgroups.level == OK and cgroups.says.startswith("cgroup v1 at /sys/fs/cgroup: cpu cpuacct cpuset blkio")
    assert "job groups would go in " in cgroups.says
    access = check_write_access(NodeRoots(), tmp_path / "state")
    assert access.level == OK and str(tmp_path / "state") in access.says


def test_v2_reports_what_is_available_and_delegated_where_job_groups_would_go(tmp_path: Path) -> None:
    finding = check_cgroups(_v2_node(tmp_path, "cpuset cpu io memory pids", "cpu io"), "adloader")
    assert finding.level == OK
    assert "job groups would go in /system.slice/train.service/adloader" in finding.says
    assert "available there: cpu cpuset io memory pids; delegated (subtree_control): cpu io" in finding.says


def test_v2_without_io_warns_what_is_lost_and_without_cpu_fails(tmp_path: Path) -> None:
    no_io = check_cgroups(_v2_node(tmp_path / "a", "cpuset cpu memory pids"), "adloader")
    assert no_io.level == WARN and "io (read bandwidth cannot be shared)" in no_io.says and "Delegate=yes" in no_io.fix
    no_cpu = check_cgroups(_v2_node(tmp_path / "b", "io memory pids"), "adloader")
    assert no_cpu.level == FAIL and "cpu is not available" in no_cpu.says and "+cpu" in no_cpu.fix


def test_v2_tree_the_controller_may_not_write_fails_write_access(tmp_path: Path) -> None:
    node = _v2_node(tmp_path, "io memory pids")  # no cpu: the backend's own detection refuses it
    finding = check_write_access(node, tmp_path / "state")
    assert finding.level == FAIL and "cpu controller is not in" in finding.says and "root" in finding.fix


def test_no_cgroups_warns_of_the_affinity_fallback(tmp_path: Path) -> None:
    finding = check_cgroups(NodeRoots(cgroup=tmp_path, proc=_proc(tmp_path / "proc", {})), "adloader")
    assert finding.level == WARN and "CPU affinity" in finding.says and "mount cgroup2" in finding.fix


@pytest.mark.parametrize("processes, words", [
    ({1: ("systemd", "0::/init.scope\n"), 70: ("slurmd", "0::/system.slice/slurmd.service\n"),
      80: ("python3", "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n")}, "Slurm: "),
    ({1: ("systemd", "0::/init.scope\n"), 90: ("kubelet", "0::/system.slice/kubelet.service\n"),
      91: ("python3", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-pod1.slice/cri-a.scope\n")}, "kubelet: "),
    ({1: ("systemd", "0::/init.scope\n"), 5: ("python3", "0::/user.slice/user-0.slice/session-1.scope\n")},
     "systemd: "),
    ({1: ("init", "0::/\n")}, "a bare node"),
])
def test_the_scheduler_layout_is_named(tmp_path: Path, processes: dict, words: str) -> None:
    finding = check_scheduler(NodeRoots(proc=_proc(tmp_path, processes)))
    assert finding.level == OK and finding.says.startswith(words)


def test_the_scheduler_of_this_machine_is_found_from_the_real_proc() -> None:
    finding = check_scheduler(NodeRoots())
    assert finding.level == OK and finding.says.split(":")[0] in ("Slurm", "kubelet", "systemd", "a bare node")


def test_no_controller_is_a_warning_with_how_to_start_one(tmp_path: Path) -> None:
    finding, node = check_controller([tmp_path / "none.sock"])
    assert finding.level == WARN and node is None
    assert f"no controller at {tmp_path / 'none.sock'}" in finding.says and "systemctl start" in finding.fix


def test_a_running_controller_answers_and_its_read_device_is_reported(
    start_controller, tmp_path: Path,
) -> None:
    controller: ControllerProcess = start_controller("--policy", "even", "--cpus", "0", "--read-device", "254:0",
                                                     "--read-bps", "100e6")
    finding, node = check_controller([controller.socket])
    assert finding.level == OK and f"answers at {controller.socket}: policy even, backend cgroup-v1" in finding.says
    read = check_read_device(NodeRoots(), None, node)
    assert read.level == OK and read.says.startswith("the controller shares 100 MB/s of device 254:0")


def test_the_read_device_of_a_real_directory_and_of_tmpfs(tmp_path: Path) -> None:
    real = check_read_device(NodeRoots(), REPO, None)
    assert real.level == OK and real.says.startswith(f"{REPO} is read from device ")
    shm = Path("/dev/shm")
    if shm.is_dir():
        tmpfs = check_read_device(NodeRoots(), shm, None)
        assert tmpfs.level == WARN and "not on a block device" in tmpfs.says and "--read-device" in tmpfs.fix


@pytest.mark.parametrize("available_kb, level", [(30 << 20, OK), (3 << 20, WARN), (1 << 20, FAIL)])
def test_the_memory_reserve_against_what_is_available(tmp_path: Path, available_kb: int, level: str) -> None:
    proc = _proc(tmp_path, {}, f"MemTotal: {64 << 20} kB\nMemAvailable: {available_kb} kB\n")
    finding = check_memory_reserve(NodeRoots(proc=proc), 2 << 30)
    assert finding.level == level and finding.says.startswith("reserve 2.0 GiB of 64.0 GiB")
    assert (level == OK) == (finding.fix == "")


@pytest.mark.slow  # imports torch three times (here and in two probes)
def test_torch_imports_here_and_cuda_is_judged_against_the_nodes_gpus(tmp_path: Path) -> None:
    import torch

    here = check_torch(NodeRoots(), sys.executable)
    assert f"torch {torch.__version__} in {sys.executable}" in here.says
    assert here.level == (OK if torch.cuda.is_available() else WARN)
    if not torch.cuda.is_available():  # a node whose driver shows a GPU that this torch cannot use
        info = tmp_path / "driver" / "nvidia" / "gpus" / "0000:01:00.0" / "information"
        info.parent.mkdir(parents=True)
        info.write_text("Model: \t\t NVIDIA H100 80GB HBM3\n")
        gpu_node = check_torch(NodeRoots(proc=tmp_path), sys.executable)
        assert gpu_node.level == FAIL and "NVIDIA H100 80GB HBM3" in gpu_node.says


def test_a_python_without_torch_fails_with_how_to_install_it(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    finding = check_torch(NodeRoots(), str(bare / "bin" / "python"))
    assert finding.level == FAIL and "No module named 'torch'" in finding.says and "install.sh" in finding.fix


def test_the_throughput_model_corpus_is_judged_against_this_cpu_and_the_nodes_own(tmp_path: Path) -> None:
    """A CPU node whose CPU is not the shipped corpus's is told how to profile its own; one that has
    profiled is fitted on it; a GPU node needs neither (the controller decides the same way)."""
    shipped_cpu = load_corpus()["cpu_model"]
    state = tmp_path / "state"
    state.mkdir()

    def node(cpu: str, gpu: str = "") -> NodeRoots:
        proc = _proc(tmp_path / cpu.replace(" ", "-") / gpu.replace(" ", "-"), {})
        (proc / "cpuinfo").write_text(f"processor\t: 0\nmodel name\t: {cpu}\n")
        if gpu:
            info = proc / "driver" / "nvidia" / "gpus" / "0000:17:00.0" / "information"
            info.parent.mkdir(parents=True)
            info.write_text(f"Model: \t\t {gpu}\n")
        return NodeRoots(proc=proc)

    other = check_throughput_model(node("Another CPU 9000"), state)
    assert other.level == WARN and f"profiled on another CPU ({shipped_cpu})" in other.says
    assert other.fix.endswith(f"adloader model profile --out {state / CORPUS_FILE}")
    assert check_throughput_model(node(shipped_cpu), state).level == OK
    gpu = check_throughput_model(node("Another CPU 9000", "NVIDIA H100 80GB HBM3"), state)
    assert gpu.level == OK and "GPU prior" in gpu.says

    (state / CORPUS_FILE).write_text(json.dumps({**load_corpus(), "cpu_model": "Another CPU 9000"}))
    own = check_throughput_model(node("Another CPU 9000"), state)
    assert own.level == OK and f"this node's corpus {state / CORPUS_FILE} (profiled on Another CPU 9000)" in own.says
    (state / CORPUS_FILE).write_text("{not json")
    broken = check_throughput_model(node("Another CPU 9000"), state)
    assert broken.level == WARN and "cannot read the corpus" in broken.says and "adloader model profile" in broken.fix
    (state / CORPUS_FILE).write_text(json.dumps({**load_corpus(), "points": load_corpus()["points"][:2]}))
    too_small = check_throughput_model(node("Another CPU 9000"), state)  # would fit nothing: the shipped one serves
    assert too_small.level == WARN and "2 point(s), too few to fit" in too_small.says
    assert "predicting from the shipped corpus" in too_small.says


def test_exit_status_and_the_words_of_each_level() -> None:
    findings = [Finding("cgroups", OK, "cgroup v2"), Finding("torch", WARN, "no GPU", "use a GPU node")]
    assert exit_status(findings) == 1 and exit_status(findings[:1]) == 0
    assert exit_status([*findings, Finding("write access", FAIL, "read-only", "run as root")]) == 2
    assert render(findings).splitlines() == [
        "ok    cgroups  cgroup v2",
        "warn  torch    no GPU",
        "               fix: use a GPU node",
        "ready, with less: see the fixes for torch",
    ]


def test_the_command_on_a_v2_fixture_tree_exits_2_and_names_what_to_fix(tmp_path: Path) -> None:
    node = _v2_node(tmp_path, "io memory pids")
    proc = subprocess.run(
        [sys.executable, "-m", "adloader", "doctor", "--cgroup-root", str(node.cgroup), "--proc", str(node.proc),
         "--socket", str(tmp_path / "none.sock"), "--state-dir", str(tmp_path / "state"), "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=base_environment(),
    )
    assert proc.returncode == 2, proc.stderr
    document = json.loads(proc.stdout)
    levels = {f["check"]: f["level"] for f in document["findings"]}
    assert document["status"] == 2 and levels["cgroups"] == FAIL and levels["controller"] == WARN
    assert list(levels) == ["cgroups", "write access", "scheduler", "controller", "read device", "memory reserve",
                            "torch", "throughput model"]


def test_the_command_on_this_machine_says_each_check_in_a_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "adloader", "doctor", "--socket", "/nonexistent/adloader.sock"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=base_environment())
    lines = proc.stdout.splitlines()
    assert proc.returncode in (1, 2) and proc.stderr == ""
    checks = [line.split()[1] for line in lines if line.split()[0] in (OK, WARN, FAIL)]
    assert checks == ["cgroups", "write", "scheduler", "controller", "read", "memory", "torch", "throughput"]
    assert lines[-1].startswith("ready, with less" if proc.returncode == 1 else "not ready")


def test_the_throughput_model_check_imports_neither_torch_nor_scikit_learn(tmp_path: Path) -> None:
    """The doctor probes torch only in a subprocess, so that a broken torch cannot take it down."""
    probe = ("import sys; from pathlib import Path; from controller.doctor import NodeRoots, check_throughput_model; "
             f"check_throughput_model(NodeRoots(), Path({str(tmp_path)!r})); "
             "print(sorted(m for m in ('torch', 'sklearn') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=base_environment())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
