"""``adloader controller``: run the node daemon in the foreground until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from adloader import paths
from adloader.errors import AdloaderError

if TYPE_CHECKING:
    from controller.daemon import Controller

log = logging.getLogger(__name__)


class ConfigError(AdloaderError):
    """The command line asks for something inconsistent."""


def configure(parser: argparse.ArgumentParser) -> None:
    from controller.policies import policy_names
    from controller.training_processes import MODES

    parser.add_argument("--socket", type=Path, default=None, metavar="PATH",
                        help="Unix socket to serve (default: $ADLOADER_SOCKET, else /run/adloader/adloader.sock "
                        "as root, else the per-user $XDG_RUNTIME_DIR/adloader/adloader.sock or "
                        "/tmp/adloader-<uid>/adloader.sock)")
    parser.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                        help="where the state file lives (default /var/lib/adloader as root)")
    parser.add_argument("--policy", choices=policy_names(), default=None,
                        help="allocation policy (default: the one saved in the state file, else adaptive when "
                        "installed, else even)")
    parser.add_argument("--period", type=_positive_float, default=1.0, metavar="SECONDS",
                        help="control period (default 1)")
    parser.add_argument("--settle-period", type=_positive_float, default=0.5, metavar="SECONDS",
                        help="control period while the node settles, until each newcomer's loading curve has "
                        "matured (default 0.5; at most --period)")
    parser.add_argument("--cpus", default=None, metavar="SPEC",
                        help="CPU ids to share between jobs, e.g. 0-13 (default: every CPU this process may use)")
    parser.add_argument("--backend", choices=["auto", "cgroup-v1", "cgroup-v2", "affinity"], default="auto",
                        help="how limits are enforced (default: detect; cgroup v2, then v1, then affinity)")
    parser.add_argument("--cgroup-group", default="adloader", metavar="NAME",
                        help="name of the cgroup under which job groups are made (default adloader)")
    parser.add_argument("--read-bps", type=_positive_float, default=None, metavar="BYTES",
                        help="read bandwidth of --read-device to share, bytes/s (default: not managed)")
    parser.add_argument("--read-device", default=None, metavar="MAJ:MIN",
                        help="block device the datasets are read from, e.g. 254:0 (lsblk -o NAME,MAJ:MIN)")
    parser.add_argument("--memory-reserve", type=parse_size, default=None, metavar="BYTES",
                        help="node memory no job's DataLoader workers may take, e.g. 4G (default: 5%% of the "
                        "node's memory, at least 1G); workers are also kept within each job's memory cgroup limit")
    parser.add_argument("--training-processes", choices=MODES, default=MODES[0],
                        help="apart (default): a rank whose loader runs workers leaves its job's CPU group, so the "
                        "job's weight and quota act on its loaders only and never delay its training steps; "
                        "with-loaders: every process of a job stays in its group")
    parser.add_argument("--pending", default=None, metavar="SOURCE",
                        help="watch the jobs waiting for this node's GPUs, for the jct policy: 'slurm' (squeue, "
                        "the partitions this node is in), 'slurm:PART,...', or a JSON file kept by another program "
                        "(controller/pending_queue.py); default: none watched")
    parser.add_argument("--without", default=None, metavar="RULE[,RULE]",
                        help="for an ablation only: turn these rules of adaptive (and jct) off, and the safety net "
                        "with 'safety_net' (python -m bench.ablation; the names: controller/policies/rules.py)")
    parser.add_argument("--unmanaged-after", type=float, default=60.0, metavar="SECONDS",
                        help="a job none of whose loaders has reported this long after it registered is shown "
                        "unmanaged, with the reason, and its launcher warns in the job's output (default 60)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics on this port (default/0: no exporter)")
    parser.add_argument("--device", default=None, metavar="NAME",
                        help="accelerator the throughput model predicts for, e.g. H100 (default: the NVIDIA "
                        "driver's model name, else cpu)")
    parser.add_argument("--no-history", action="store_true",
                        help="do not predict from or record into the job history (<state-dir>/history.sqlite)")
    parser.add_argument("--metrics-address", default="127.0.0.1", metavar="ADDR",
                        help="address the metrics exporter binds (default 127.0.0.1)")
    parser.add_argument("--remove-groups", action="store_true",
                        help="do not serve: lift every limit and remove every job group under --cgroup-group, "
                        "then the group itself (the jobs keep running, unmanaged), and exit. For uninstalling; "
                        "refused while a controller manages the group")


def main(args: argparse.Namespace) -> int:
    if args.remove_groups:
        return _remove_groups(args)
    controller = _build(args)  # a usage error (AdloaderError) is reported by the dispatcher, in one line
    return asyncio.run(_serve(controller))


def _remove_groups(args: argparse.Namespace) -> int:
    from controller.backends.detect import detect_backend
    from controller.ownership import Ownership
    from controller.teardown import remove_every_group, teardown_holder

    socket = args.socket or paths.default_socket_path()
    state_dir = args.state_dir or paths.default_state_dir()
    try:
        backend = detect_backend(None if args.backend == "auto" else args.backend, args.cgroup_group)
        removed = remove_every_group(backend, Ownership(paths.default_lock_dir(), args.cgroup_group, state_dir),
                                     teardown_holder(socket, state_dir, args.cgroup_group))
    except AdloaderError as exc:
        log.error("%s", exc)
        return 1
    log.info("removed %d job group(s) and the %s group %r: no adloader limit is left", len(removed), backend.name,
             args.cgroup_group)
    return 0


def _build(args: argparse.Namespace) -> Controller:
    """The configured controller (its modules are imported here, so --help stays light)."""
    from controller.backends.cgroupfs import parse_device
    from adloader.cpuspec import online_subset
    from controller.daemon import Controller, ControllerConfig
    from controller.policies.rules import parse_without

    if (args.read_bps is None) != (args.read_device is None):
        raise ConfigError("--read-bps and --read-device go together: give both to share read bandwidth, or neither")
    if args.read_device is not None:
        parse_device(args.read_device)
    if args.cpus is None:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    else:
        cpus = online_subset(args.cpus, "--cpus")
    config = ControllerConfig(
        socket_path=args.socket or paths.default_socket_path(),
        state_dir=args.state_dir or paths.default_state_dir(),
        cpus=cpus,
        policy=args.policy,
        period_s=args.period,
        settle_period_s=args.settle_period,
        backend=None if args.backend == "auto" else args.backend,
        group=args.cgroup_group,
        read_bps=args.read_bps,
        read_device=args.read_device,
        metrics_port=args.metrics_port or None,
        metrics_address=args.metrics_address,
        memory_reserve=args.memory_reserve,
        training_processes=args.training_processes,
        unmanaged_after_s=args.unmanaged_after,
        pending=args.pending,
        rules=parse_without(args.without),
    )
    if config.rules.off:
        log.warning("ablation: adaptive runs without %s", ", ".join(config.rules.off))
    if args.no_history:
        return Controller(config)
    from controller.node_memory import NodeMemory, detect_device

    memory = NodeMemory(config.state_dir, args.device or detect_device())
    return Controller(config, predictor=memory.predict, on_job_finished=memory.record,
                      recall=memory.recall)


async def _serve(controller: Controller) -> int:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, controller.request_stop)
    try:
        await controller.run()
    except AdloaderError as exc:
        log.error("%s", exc)
        return 1
    return 0


def parse_size(text: str) -> int:
    """Bytes, with an optional K/M/G/T suffix (powers of 1024): "4G", "512M", "1073741824"."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    scale = units.get(text[-1:].upper(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a size: give bytes, or a number with K, M, G or T") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return int(value * scale)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value
