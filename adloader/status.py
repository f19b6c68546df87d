"""``adloader status``: the node's jobs and what each was given, as a table an operator
reads at a glance, refreshed in place with ``--watch``, or as JSON for scripts.

It asks the controller over its socket (a :class:`~adloader.protocol.StatusRequest`,
which anyone may send), so it needs no root. No controller answering is reported in
one line with exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from adloader import paths, protocol
from adloader.client import ControllerClient, connect_first
from adloader.errors import AdloaderError, ControllerRefused, ControllerUnavailable
from adloader.cpuspec import format_cpus
from adloader.protocol import JobSnapshot, NodeSnapshot

EXIT_NO_CONTROLLER = 2
EXIT_REFUSED = 1
"""The controller refused the request, or the command line asks for nothing sensible."""
NO_CONTROLLER_ADVICE = ("start one (sudo systemctl start adloader-controller, or adloader controller; "
                        "adloader doctor says what the node lacks), "
                        "or name its socket with --socket or ADLOADER_SOCKET")
CLEAR_SCREEN = "\x1b[H\x1b[2J"
DEFAULT_CPU_WEIGHT = 100
"""The weight of a group nobody weighted (cgroup v2's cpu.weight default; v1 cpu.shares 1024)."""

COLUMNS = ("JOB", "ID", "STATE", "GPUS", "SAMPLES/S", "MAX/S", "GPU IDLE", "CORES", "WEIGHT", "WORKERS", "MEM/WORKER",
           "READ BW", "DATA WAIT")
RIGHT_ALIGNED = frozenset(COLUMNS[3:])


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the node and its jobs as one JSON object (one per refresh with --watch)")
    parser.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) until Ctrl-C")
    parser.add_argument("--socket", type=Path, default=None,
                        help="controller socket (default: $ADLOADER_SOCKET, else the first that answers of "
                        "/run/adloader/adloader.sock and, for users other than root, the per-user socket)")


def main(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        print("adloader status: --watch needs a positive number of seconds", file=sys.stderr)
        return EXIT_REFUSED
    render = _render_json if args.json else render_table
    try:
        client = connect_first([args.socket] if args.socket else paths.client_socket_paths())
    except ControllerUnavailable as exc:
        print(f"adloader status: {exc}; {NO_CONTROLLER_ADVICE}", file=sys.stderr)
        return EXIT_NO_CONTROLLER
    with client:
        try:
            first = fetch(client)
        except ControllerUnavailable as exc:
            print(f"adloader status: {exc}; {NO_CONTROLLER_ADVICE}", file=sys.stderr)
            return EXIT_NO_CONTROLLER
        except ControllerRefused as exc:
            print(f"adloader status: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        if args.watch is None:
            print(render(first, time.time()))
            return 0
        return watch(client, render, args.watch, sys.stdout, first, gap="" if args.json else "\n")


def fetch(client: ControllerClient) -> NodeSnapshot:
    """One status request. Raises ControllerUnavailable or ControllerRefused."""
    reply = client.request(protocol.StatusRequest())
    if not isinstance(reply, protocol.Status):
        raise ControllerRefused("unexpected_reply", f"a status request was answered with {reply.TYPE!r}")
    return reply.node


def watch(client: ControllerClient, render: Callable[[NodeSnapshot, float], str], every: float,
          out: TextIO, first: NodeSnapshot, gap: str = "") -> int:
    """Redraw every ``every`` seconds until Ctrl-C. A terminal is redrawn in place;
    a pipe gets one rendering after another, ``gap`` between them. A controller that
    goes away mid-watch is reported on screen and retried, so a controller restart
    does not end the watch."""
    in_place = out.isatty()
    snapshot: NodeSnapshot | None = first
    problem = ""
    try:
        while True:
            text = render(snapshot, time.time()) if snapshot is not None else problem
            out.write(CLEAR_SCREEN + text + "\n" if in_place else text + "\n" + gap)
            out.flush()
            time.sleep(every)
            try:
                snapshot = fetch(client)
            except AdloaderError as exc:
                snapshot, problem = None, f"adloader status: {exc}; retrying every {every:g} s (Ctrl-C to stop)"
    except KeyboardInterrupt:
        return 0


def _render_json(snapshot: NodeSnapshot, now: float) -> str:
    return json.dumps(snapshot.to_dict(), separators=(",", ":"))


def render_table(snapshot: NodeSnapshot, now: float) -> str:
    """The node line, then one row per job. Pure: ``now`` is the Unix time to show ages against."""
    shares = effective_cores(snapshot)
    rows = [COLUMNS, *(_job_row(job, shares.get(job.job_id)) for job in snapshot.jobs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [_node_line(snapshot, now), ""]
    for row in rows:
        cells = (cell.rjust(w) if name in RIGHT_ALIGNED else cell.ljust(w)
                 for cell, w, name in zip(row, widths, COLUMNS))
        lines.append("  ".join(cells).rstrip())
    if not snapshot.jobs:
        lines.append("(no jobs: start one with 'adloader run -- CMD')")
    if any(job.max_sps_measured is None and job.max_sps_predicted is not None for job in snapshot.jobs):
        lines.append("~ predicted max samples/s (not measured yet)")
    if any(job.max_sps_measured is None and job.max_sps_predicted is None and job.state != "unmanaged"
           for job in snapshot.jobs):
        lines.append("- max samples/s: measured only (no model description to predict it from; "
                     "adloader.describe_model gives one); shown once the job's first steps measure it")
    if shares:
        lines.append("~ cores: what the job's CPU weight gives it when every job wants CPU (it may use more "
                     "while others idle)")
    if any(job.worker_memory_bytes is not None for job in snapshot.jobs):
        bound = any(job.worker_memory_bytes is not None and not job.worker_memory_exact for job in snapshot.jobs)
        lines.append("MEM/WORKER: a loader worker's own memory and its share of the prefetched batches, as its "
                     "memory cap counts it" + (" (<= an upper bound: the job has room to spare)" if bound else ""))
    for job in snapshot.jobs:
        if job.cgroups:
            limit = "" if job.scheduler_cpu_limit is None else f", CPU limit {job.scheduler_cpu_limit:.2f} cores"
            lines.append(f"@ {job.name} ({job.job_id}) scheduler {job.scheduler}{limit}: {cgroups_text(job.cgroups)}")
    for job in snapshot.jobs:
        if job.unmanaged_reason is not None:
            lines.append(unmanaged_text(job))
        elif job.workers_pinned is not None:
            lines.append(pinned_text(job))
    for job in snapshot.jobs:
        for field, error in sorted(job.failed_to_apply.items()):
            lines.append(f"! {job.name} ({job.job_id}): {field} not applied, retrying each period: {error}")
    return "\n".join(lines)


def unmanaged_text(job: JobSnapshot) -> str:
    """``! train.py (j1a2b3c4): unmanaged: <why>. ...``: why no loader of the job is adloader's,
    and what it still gets."""
    used = f" (it uses {job.cores_used:.1f})" if job.cores_used is not None else ""
    return (f"! {job.name} ({job.job_id}): unmanaged: {job.unmanaged_reason}. It keeps a fair CPU share from "
            f"what its group uses{used}; its data loading is not planned")


def pinned_text(job: JobSnapshot) -> str:
    """``= train.py (j1a2b3c4): workers pinned to 6 in all ...``: an operator's pin, and what holds
    the job below it."""
    held = "" if job.workers_target is None or job.workers_target >= job.workers_pinned else \
        f" (target {job.workers_target}: an even split over its ranks, within what its memory holds)"
    return (f"= {job.name} ({job.job_id}): workers pinned to {job.workers_pinned} in all{held}; "
            f"'adloader workers {job.job_id} auto' gives them back to the policy")


def cgroups_text(paths: dict[str, str]) -> str:
    """``cpu,blkio=/adloader/j1 cpuacct,cpuset=/slurm_n/uid_0/job_5/step_0/adloader/j1``: the job's
    group in each hierarchy, hierarchies with the same path named together."""
    by_path: dict[str, list[str]] = {}
    for hierarchy, path in sorted(paths.items()):
        by_path.setdefault(path, []).append(hierarchy)
    return " ".join(f"{','.join(names)}={path}" for path, names in by_path.items())


def effective_cores(node: NodeSnapshot) -> dict[str, float]:
    """Cores each job without a CPU quota gets when every job is busy: its weight's share of
    the cores left, after the quotas, on the CPU set it shares with others (a job with no
    weight counts with the kernel's default). Job id -> cores; pure.

    Jobs are grouped by identical CPU sets; partly overlapping sets, and weights that do not
    act across different parent cgroups (nested placement), make this an approximation."""
    by_cpus: dict[tuple[int, ...], list[JobSnapshot]] = {}
    for job in node.jobs:
        if job.state != "gone":
            by_cpus.setdefault(tuple(job.cpus or node.cpus), []).append(job)
    shares: dict[str, float] = {}
    for cpus, jobs in by_cpus.items():
        room = max(0.0, len(cpus) - sum(job.cores for job in jobs if job.cores is not None))
        weighted = [job for job in jobs if job.cores is None]
        total = sum(job.cpu_weight or DEFAULT_CPU_WEIGHT for job in weighted)
        for job in weighted:
            shares[job.job_id] = room * (job.cpu_weight or DEFAULT_CPU_WEIGHT) / total
    return shares


def _node_line(node: NodeSnapshot, now: float) -> str:
    bandwidth = f"read {_bytes_per_second(node.read_bps)} on {node.read_device}" if node.read_bps else "read unmanaged"
    return (f"adloader {node.version}  policy {node.policy}  backend {node.backend}  "
            f"{len(node.cpus)} cores ({format_cpus(node.cpus) if node.cpus else '-'})  {bandwidth}  "
            f"{len(node.jobs)} jobs  {node.connected_clients} clients  up {_duration(now - node.started_at)}")


def cores_text(job: JobSnapshot, share: float | None) -> str:
    """A job's CPU as status shows it: its quota, else ``~`` and its weight's share, else ``-``."""
    if job.cores is not None:
        return f"{job.cores:.1f}"
    return f"~{share:.1f}" if share is not None else "-"


def _job_row(job: JobSnapshot, share: float | None) -> tuple[str, ...]:
    if job.max_sps_measured is not None:
        max_sps = _rate(job.max_sps_measured)
    elif job.max_sps_predicted is not None:
        max_sps = "~" + _rate(job.max_sps_predicted)
    else:
        max_sps = "-"
    if job.state == "unmanaged":
        workers = "-"  # no loader of ours: nothing to count or to set
    else:
        workers = f"{job.workers_running}/{job.workers_target if job.workers_target is not None else '-'}"
        if job.workers_pinned is not None:
            workers += " pinned"
    return (
        job.name, job.job_id, job.state, str(job.gpus) if job.gpus else "-", _rate(job.achieved_sps), max_sps,
        _percent(job.gpu_idle_ratio), cores_text(job, share),
        str(job.cpu_weight) if job.cpu_weight is not None else "-", workers, worker_memory_text(job),
        _bytes_per_second(job.read_bps), _percent(job.data_wait_ratio),
    )


def worker_memory_text(job: JobSnapshot) -> str:
    """What a loader worker costs (its own pages and its share of the prefetched batches), in
    MiB; ``<=`` where only the cheap upper bound was read (a job with room to spare), ``-``
    before a worker is measured."""
    if job.worker_memory_bytes is None:
        return "-"
    bound = "" if job.worker_memory_exact else "<="
    return f"{bound}{job.worker_memory_bytes / 2**20:.0f}M"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.0f}%"


def _bytes_per_second(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B/s"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s"
