"""``adloader doctor``'s checks: is this node ready for the controller, and what to fix.

One small function per check, each returning a :class:`Finding` (ok, warn or fail, in
words, with the fix). They reuse what the controller itself uses to decide (backend
detection, placement, the read device, the memory reserve, the socket search), so the
doctor and the controller cannot disagree. Every root (cgroup mount, /proc, /sys) is
an argument; nothing here writes anything. Formatting lives in controller/doctor_cli.py.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from adloader import paths, protocol
from adloader.client import connect_first
from adloader.errors import AdloaderError
from controller.backends.base import BackendError
from controller.backends.blockdev import read_device_of
from controller.backends.detect import v1_problem, v2_problem
from controller.backends.placement import UNIFIED, cgroups_of, detect_scheduler, parent_below
from controller.node_memory import choose_corpus, detect_device
from controller.worker_memory import default_reserve, read_meminfo

OK, WARN, FAIL = "ok", "warn", "fail"
LEVELS = (OK, WARN, FAIL)

V1_HIERARCHIES = {  # hierarchy -> (its key file, what is lost without it)
    "cpu": ("cpu.cfs_quota_us", None),
    "cpuacct": ("cpuacct.usage", "per-job CPU time is not measured"),
    "cpuset": ("cpuset.cpus", "jobs cannot be confined to cores"),
    "blkio": ("blkio.throttle.read_bps_device", "read bandwidth cannot be shared"),
    "memory": ("memory.limit_in_bytes", "loader workers are not kept within each job's memory limit"),
}
V2_WANTED = {  # controller -> what is lost without it (cpu is required)
    "cpuset": "jobs cannot be confined to cores",
    "io": "read bandwidth cannot be shared",
    "memory": "loader workers are not kept within each job's memory limit",
}
TORCH_PROBE = (
    "import json, torch\n"
    "cuda = torch.cuda.is_available()\n"
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, 'available': cuda,\n"
    "                  'devices': torch.cuda.device_count() if cuda else 0}))\n"
)
LOW_MEMORY_FACTOR = 2
"""Available memory under this many reserves: a warning (a few more workers take the rest)."""


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``level`` is ok, warn or fail; ``says`` what was found; ``fix`` what to do."""

    check: str
    level: str
    says: str
    fix: str = ""


@dataclass(frozen=True)
class NodeRoots:
    """Where the doctor looks. Defaults are the real node's."""

    cgroup: Path = Path("/sys/fs/cgroup")
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    pid: int = field(default_factory=os.getpid)
    """The process whose cgroups stand for a launcher's (where job groups would nest)."""


def exit_status(findings: Sequence[Finding]) -> int:
    """0 when every check is ok, 1 when the worst is a warning, 2 when any failed."""
    return max((LEVELS.index(f.level) for f in findings), default=0)


def cgroup_version(roots: NodeRoots) -> int | None:
    """2 for a cgroup2 mount at the root, 1 for v1 hierarchies under it, None for neither."""
    if (roots.cgroup / "cgroup.controllers").is_file():
        return 2
    if any((roots.cgroup / h).is_dir() for h in V1_HIERARCHIES):
        return 1
    return None


def check_cgroups(roots: NodeRoots, group: str) -> Finding:
    """The cgroup version, the controllers available, and those delegated to where job groups would go."""
    version = cgroup_version(roots)
    if version == 2:
        return _v2_controllers(roots, group)
    if version == 1:
        return _v1_hierarchies(roots, group)
    return Finding("cgroups", WARN, f"no cgroup mount at {roots.cgroup}: the controller falls back to CPU "
                   "affinity (no CPU quota, no read throttle, workers only)",
                   "mount cgroup2 at /sys/fs/cgroup (the default of systemd 247 and later), or the v1 cpu, "
                   "cpuset and blkio hierarchies under it")


def _v2_controllers(roots: NodeRoots, group: str) -> Finding:
    parent = parent_below(cgroups_of(roots.pid, roots.proc).get(UNIFIED, "/"), group)
    where = roots.cgroup / parent.lstrip("/")
    available = _words(where / "cgroup.controllers")
    delegated = _words(where / "cgroup.subtree_control")
    says = (f"cgroup v2 at {roots.cgroup}; job groups would go in {parent.rstrip('/')}/{group}: "
            f"available there: {' '.join(sorted(available)) or 'none'}; delegated (subtree_control): "
            f"{' '.join(sorted(delegated)) or 'none'}")
    if "cpu" not in available:
        return Finding("cgroups", FAIL, says + "; cpu is not available, so no CPU share can be given",
                       f"enable cpu for {parent}: echo +cpu into each cgroup.subtree_control from {roots.cgroup} "
                       "down to it (for a systemd unit: Delegate=yes)")
    lost = [f"{name} ({loss})" for name, loss in V2_WANTED.items() if name not in available]
    if lost:
        return Finding("cgroups", WARN, says + "; missing: " + "; ".join(lost),
                       "enable them in the parents' cgroup.subtree_control (for a systemd unit: Delegate=yes)")
    return Finding("cgroups", OK, says)


def _v1_hierarchies(roots: NodeRoots, group: str) -> Finding:
    mounted = [h for h, (key, _) in V1_HIERARCHIES.items() if (roots.cgroup / h / key).is_file()]
    parent = parent_below(cgroups_of(roots.pid, roots.proc).get("cpu", "/"), group)
    says = (f"cgroup v1 at {roots.cgroup}: {' '.join(mounted) or 'no'} hierarchies mounted; job groups would go "
            f"in {parent.rstrip('/')}/{group} of the cpu hierarchy")
    if "cpu" not in mounted:
        return Finding("cgroups", FAIL, says + "; without the cpu hierarchy no CPU share can be given",
                       f"mount it: mount -t cgroup -o cpu cgroup {roots.cgroup / 'cpu'}")
    lost = [f"{h} ({loss})" for h, (_, loss) in V1_HIERARCHIES.items() if h not in mounted]
    if lost:
        return Finding("cgroups", WARN, says + "; missing: " + "; ".join(lost),
                       f"mount the missing hierarchies under {roots.cgroup} (mount -t cgroup -o NAME cgroup DIR)")
    return Finding("cgroups", OK, says)


def check_write_access(roots: NodeRoots, state_dir: Path) -> Finding:
    """Whether the controller may write the cgroups (what backend detection decides on) and its state directory."""
    version = cgroup_version(roots)
    problem = v2_problem(roots.cgroup) if version == 2 else v1_problem(roots.cgroup) if version == 1 else None
    existing = next((p for p in (state_dir, *state_dir.parents) if p.exists()), Path("/"))
    state_problem = None if os.access(existing, os.W_OK) else f"{existing} is not writable (state dir {state_dir})"
    if problem:
        return Finding("write access", FAIL, f"cannot write the cgroups: {problem}",
                       "run the controller as root (the systemd unit does), or delegate a cgroup subtree to its user")
    if state_problem:
        return Finding("write access", FAIL, state_problem,
                       "run the controller as root, or give it a writable --state-dir")
    if version is None:
        return Finding("write access", OK, f"state directory {state_dir} writable (no cgroups to write)")
    return Finding("write access", OK, f"cgroups under {roots.cgroup} and state directory {state_dir} writable")


def check_scheduler(roots: NodeRoots) -> Finding:
    """The scheduler layout job groups nest under: Slurm, kubelet, systemd, or a bare node."""
    commands = _commands(roots.proc)
    daemons = {name: pid for pid, name in commands if name in ("slurmd", "kubelet", "systemd")}
    layout = detect_scheduler({path for pid, _ in commands for path in cgroups_of(pid, roots.proc).values()})
    if "slurmd" in daemons:  # no job running yet: no Slurm cgroup to see, but its daemon says where jobs go
        layout = "slurm"
    elif "kubelet" in daemons and layout != "slurm":
        layout = "kubernetes"
    running = ", ".join(f"{name} (pid {pid})" for name, pid in sorted(daemons.items()))
    words = {"slurm": "Slurm: each job's group nests under its Slurm job's cgroup, inside its allocation",
             "kubernetes": "kubelet: each job's group nests under its pod's cgroup, inside its limits",
             "systemd": "systemd: each job's group nests under the service or session scope it runs in",
             "none": "a bare node: job groups go under /<group>/<job>"}[layout]
    return Finding("scheduler", OK, words + (f" (running: {running})" if running else ""))


def check_controller(sockets: Sequence[Path]) -> tuple[Finding, protocol.NodeSnapshot | None]:
    """Whether a controller answers on the sockets a client would try, and what it serves."""
    try:
        with connect_first(sockets) as client:
            reply = client.request(protocol.StatusRequest())
    except AdloaderError as exc:
        return (Finding("controller", WARN, f"not running: {exc}",
                        "start it: sudo systemctl start adloader-controller (installed by sudo ./install.sh "
                        "--system), or sudo adloader controller; jobs run unmanaged until then"), None)
    if not isinstance(reply, protocol.Status):
        return Finding("controller", FAIL, f"the socket answered a status request with {reply.TYPE!r}",
                       "another program owns the socket: stop it, or give adloader another --socket"), None
    node = reply.node
    return (Finding("controller", OK, f"adloader {node.version} answers at {client.path}: policy {node.policy}, "
                    f"backend {node.backend}, {len(node.jobs)} job(s)"), node)


def check_read_device(roots: NodeRoots, data: Path | None, node: protocol.NodeSnapshot | None) -> Finding:
    """The block device datasets are read from, and whether its read bandwidth can be shared."""
    if node is not None and node.read_device:
        return Finding("read device", OK, f"the controller shares {node.read_bps / 1e6:.0f} MB/s of device "
                       f"{node.read_device} ({_device_name(roots, node.read_device)})")
    target = data or Path.cwd()
    try:
        device = read_device_of(target, roots.proc, roots.sys)
    except BackendError as exc:
        return Finding("read device", WARN, str(exc), "point --data at the datasets' directory, or pass "
                       "--read-device MAJ:MIN to the controller")
    return Finding("read device", WARN if node is not None else OK,
                   f"{target} is read from device {device} ({_device_name(roots, device)})"
                   + ("; the controller does not share its bandwidth" if node is not None else ""),
                   f"to share its read bandwidth: adloader controller --read-device {device} --read-bps BYTES "
                   "(its sustained read rate)")


def check_memory_reserve(roots: NodeRoots, reserve: int | None) -> Finding:
    """The node memory no loader worker may take, against what is available now."""
    reserve = default_reserve(roots.proc) if reserve is None else reserve
    meminfo = read_meminfo(roots.proc)
    total, available = meminfo.get("MemTotal", 0), meminfo.get("MemAvailable", 0)
    says = (f"reserve {_gib(reserve)} of {_gib(total)}; {_gib(available)} available now")
    if available <= reserve:
        return Finding("memory reserve", FAIL, says + ": no loader worker may be added",
                       "free memory, or lower the reserve (adloader controller --memory-reserve BYTES)")
    if available < LOW_MEMORY_FACTOR * reserve:
        return Finding("memory reserve", WARN, says + f": under {LOW_MEMORY_FACTOR}x the reserve, few workers "
                       "can be added", "free memory, or lower the reserve (--memory-reserve BYTES)")
    return Finding("memory reserve", OK, says)


def check_torch(roots: NodeRoots, python: str, timeout_s: float = 120.0) -> Finding:
    """torch imports in ``python`` (a subprocess: a broken CUDA build cannot take the doctor down), and CUDA
    works where the node has an NVIDIA GPU."""
    gpu = detect_device(roots.proc)
    try:
        probe = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("torch", FAIL, f"cannot run {python}: {exc}", "pass --python PATH of the jobs' Python")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return Finding("torch", FAIL, f"torch does not import in {python}: {last}",
                       "install it: ./install.sh (the CPU build 2.13.0 if none), or the CUDA build from pytorch.org")
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    says = f"torch {found['version']} in {python}"
    if found["available"]:
        return Finding("torch", OK, says + f": CUDA {found['cuda']} works, {found['devices']} GPU(s)")
    if gpu != "cpu":
        return Finding("torch", FAIL, says + f": CUDA does not work, though the node has {gpu}",
                       "install the torch build for this driver's CUDA version (nvidia-smi shows it)")
    return Finding("torch", WARN, says + ": no NVIDIA GPU on this node (no /proc/driver/nvidia), so jobs train "
                   "on CPU", "for trying adloader, GPU-emulated: adloader demo; for training, a GPU node")


def check_throughput_model(roots: NodeRoots, state_dir: Path) -> Finding:
    """The corpus the controller fits its CPU throughput model on (controller/node_memory.py decides)."""
    choice = choose_corpus(state_dir, detect_device(roots.proc), roots.proc / "cpuinfo")
    return Finding("throughput model", WARN if choice.warn else OK, choice.says, choice.fix)


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _commands(proc: Path) -> list[tuple[int, str]]:
    """(pid, command name) of every process under ``proc``."""
    found = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "comm").read_text().strip()))
            except OSError:
                continue
    return found


def _device_name(roots: NodeRoots, device: str) -> str:
    """"vda" for "254:0", from /sys/dev/block/MAJ:MIN/uevent; the number itself when unknown."""
    try:
        for line in (roots.sys / "dev" / "block" / device / "uevent").read_text().splitlines():
            if line.startswith("DEVNAME="):
                return "/dev/" + line.split("=", 1)[1]
    except OSError:
        pass
    return "unknown device"


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


def run_checks(roots: NodeRoots, group: str, state_dir: Path, sockets: Sequence[Path], data: Path | None,
               reserve: int | None, python: str) -> list[Finding]:
    """Every check, in the order an operator fixes them."""
    controller, node = check_controller(sockets)
    return [check_cgroups(roots, group), check_write_access(roots, state_dir), check_scheduler(roots), controller,
            check_read_device(roots, data, node), check_memory_reserve(roots, reserve), check_torch(roots, python),
            check_throughput_model(roots, state_dir)]
