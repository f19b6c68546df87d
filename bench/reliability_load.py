"""Load on the controller's socket: many reporting clients, connection churn, slow clients.

Two halves:
  * ``python -m bench.reliability_load --connections C --seconds S`` is a job's command
    (run it under ``adloader run``): C asyncio connections from inside the job's cgroup,
    each a rank reporting about once per ``--interval`` seconds, each reply timed. It
    prints one JSON line of :class:`ClientFigures` when done;
  * :func:`run_load` drives a node: it holds slow clients (half a line written, never
    finished until the end), starts the load jobs, runs connect/disconnect cycles beside
    them, samples the controller's file descriptors, memory and CPU, and checks that
    nobody was kept waiting and that the descriptors went back to the baseline.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from adloader import env, paths, protocol
from adloader.errors import ProtocolError
from bench.reliability_node import Node, poll

SLOW_PREFIX = b'{"v":1,"type":"sta'
"""What a slow client writes, and then holds: half of a status request."""


@dataclass
class ClientFigures:
    """What one load job's connections saw."""

    connections: int = 0
    requests: int = 0
    replies: int = 0
    timeouts: int = 0
    """Requests not answered within the timeout: blocked clients."""
    failures: dict[str, int] = field(default_factory=dict)
    """Connection errors and Error replies, by kind."""
    latencies_ms: list[float] = field(default_factory=list)


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------- the job side


async def _rank(rank: int, world: int, job_id: str, path: str, seconds: float, interval: float, timeout: float,
                figures: ClientFigures, failures: Counter) -> None:
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=protocol.MAX_LINE_BYTES + 1)
    except OSError as exc:
        failures[f"connect: {exc.strerror or exc}"] += 1
        return
    figures.connections += 1
    await asyncio.sleep(random.uniform(0, interval))  # spread the ranks over the interval
    end, samples = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < end:
            next_at = time.monotonic() + interval
            samples += 32
            report = protocol.Report(job_id=job_id, rank=rank, world_size=world, batch_size=32, samples=samples,
                                     batches=samples // 32, compute_s=samples / 3200, num_workers=1)
            started = time.perf_counter()
            writer.write(protocol.encode(report))
            figures.requests += 1
            try:
                line = await asyncio.wait_for(reader.readline(), timeout)
            except asyncio.TimeoutError:
                figures.timeouts += 1
                return
            if not line:
                failures["closed by the controller"] += 1
                return
            figures.latencies_ms.append((time.perf_counter() - started) * 1000)
            figures.replies += 1
            try:
                reply = protocol.decode(line.rstrip(b"\n"))
            except ProtocolError as exc:
                failures[f"bad reply: {exc.code}"] += 1
                continue
            if isinstance(reply, protocol.Error):
                failures[f"error reply: {reply.code}"] += 1
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    except (ConnectionError, OSError) as exc:
        failures[f"connection: {type(exc).__name__}"] += 1
    finally:
        writer.close()


async def _load(connections: int, seconds: float, interval: float, timeout: float) -> ClientFigures:
    job_id = env.job_id()
    figures, failures = ClientFigures(), Counter()
    if job_id is None:
        figures.failures = {"not managed: ADLOADER_JOB_ID unset": 1}
        return figures
    path = str(paths.default_socket_path())
    await asyncio.gather(*(_rank(rank, connections, job_id, path, seconds, interval, timeout, figures, failures)
                           for rank in range(connections)))
    figures.failures = dict(failures)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Report to the controller from many connections (a load job).")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between one rank's reports")
    parser.add_argument("--timeout", type=float, default=10.0, help="a reply later than this is a blocked client")
    args = parser.parse_args(argv)
    raise_fd_limit()
    figures = asyncio.run(_load(args.connections, args.seconds, args.interval, args.timeout))
    figures.latencies_ms = [round(x, 3) for x in figures.latencies_ms]
    print(json.dumps(asdict(figures)), flush=True)
    return 0


# ---------------------------------------------------------------- the node side


class ControllerSampler(threading.Thread):
    """Samples the controller's open file descriptors and resident memory until stopped."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        super().__init__(name="controller-sampler", daemon=True)
        self.process = psutil.Process(pid)
        self.every_s = every_s
        self.peak_fds = 0
        self.peak_rss = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                self.peak_fds = max(self.peak_fds, self.process.num_fds())
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
            except psutil.NoSuchProcess:
                return


@dataclass
class LoadReport:
    clients: int
    seconds: float
    requests: int
    replies: int
    blocked: int
    """Requests never answered in time, plus slow clients and cycles left unanswered."""
    failures: dict[str, int]
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    latency_max_ms: float | None
    cycles: int
    cycles_per_s: float
    slow_clients: int
    fds_baseline: int
    fds_peak: int
    fds_after: int
    rss_baseline: int
    rss_peak: int
    rss_after: int
    controller_cpu_percent: float
    """Controller CPU time over the load phase, in percent of one core."""
    violations: list[str]


def run_load(node: Node, jobs: int, connections: int, seconds: float, cycles: int, slow_clients: int,
             interval: float = 1.0) -> LoadReport:
    """``jobs`` load jobs of ``connections`` reporting ranks each for ``seconds``, with
    ``cycles`` connect/disconnect cycles and ``slow_clients`` half-written lines alongside."""
    raise_fd_limit()
    controller = node.controller
    process = psutil.Process(controller.proc.pid)
    fds_baseline, rss_baseline = process.num_fds(), process.memory_info().rss
    cpu_before = sum(process.cpu_times()[:2])
    sampler = ControllerSampler(process.pid)
    sampler.start()
    slow = [_slow_client(controller.socket) for _ in range(slow_clients)]
    started = time.monotonic()
    load_jobs = [node.controller.run(sys.executable, "-m", "bench.reliability_load", "--connections",
                                     str(connections), "--seconds", str(seconds), "--interval", str(interval),
                                     name=f"load-{i}") for i in range(jobs)]
    poll(lambda: controller.status().connected_clients >= jobs * (connections + 1) + slow_clients, 60, interval=0.2)
    cycled = _cycle_connections(controller.socket, cycles)  # while the load clients report
    for job in load_jobs:
        job.proc.wait(seconds + 120)
    wall = time.monotonic() - started
    cpu_percent = 100 * (sum(process.cpu_times()[:2]) - cpu_before) / wall
    slow_answered = sum(_finish_slow_client(sock) for sock in slow)
    fds_after = poll(lambda: (lambda n: n if n <= fds_baseline else None)(process.num_fds()), 15) or process.num_fds()
    sampler.stop.set()
    sampler.join()

    figures = [_figures(job) for job in load_jobs]
    latencies = sorted(x for f in figures for x in f.latencies_ms)
    failures: Counter = Counter()
    for f in figures:
        failures.update(f.failures)
    failures.update(cycled.failures)
    requests, replies = sum(f.requests for f in figures), sum(f.replies for f in figures)
    blocked = sum(f.timeouts for f in figures) + (slow_clients - slow_answered) + cycled.unanswered
    violations = []
    if blocked:
        violations.append(f"{blocked} client(s) were kept waiting (timeouts, unanswered slow clients or cycles)")
    if failures:
        violations.append(f"failures: {dict(failures)}")
    if sum(f.connections for f in figures) != jobs * connections:
        violations.append(f"{sum(f.connections for f in figures)} of {jobs * connections} load clients connected")
    if fds_after > fds_baseline:
        violations.append(f"the controller holds {fds_after} file descriptors after the load, {fds_baseline} before")
    violations += [f"{job.name} exited {job.proc.returncode}: {job.output()[1][-300:]}"
                   for job in load_jobs if job.proc.returncode != 0]
    return LoadReport(
        clients=jobs * connections, seconds=seconds, requests=requests, replies=replies, blocked=blocked,
        failures=dict(failures), latency_p50_ms=_quantile(latencies, 0.50), latency_p99_ms=_quantile(latencies, 0.99),
        latency_max_ms=latencies[-1] if latencies else None, cycles=cycled.done,
        cycles_per_s=cycled.done / cycled.seconds if cycled.seconds else 0.0, slow_clients=slow_clients,
        fds_baseline=fds_baseline, fds_peak=sampler.peak_fds, fds_after=fds_after, rss_baseline=rss_baseline,
        rss_peak=max(sampler.peak_rss, rss_baseline), rss_after=process.memory_info().rss,
        controller_cpu_percent=cpu_percent, violations=violations,
    )


def _quantile(sorted_values: list[float], q: float) -> float | None:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else None


def _figures(job: Any) -> ClientFigures:
    for line in reversed(job.output()[0].splitlines()):
        if line.startswith("{"):
            return ClientFigures(**json.loads(line))
    return ClientFigures(failures={f"{job.name} printed no figures": 1})


def _slow_client(path: Any) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(path))
    sock.sendall(SLOW_PREFIX)
    return sock


def _finish_slow_client(sock: socket.socket) -> bool:
    """Write the rest of the held line; True if the controller then answers it."""
    with sock:
        try:
            sock.sendall(b'tus"}\n')
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return False
                data += chunk
            return isinstance(protocol.decode(data.rstrip(b"\n")), protocol.Status)
        except (OSError, ProtocolError):
            return False


@dataclass
class _Cycles:
    done: int = 0
    seconds: float = 0.0
    unanswered: int = 0
    failures: Counter = field(default_factory=Counter)


def _cycle_connections(path: Any, cycles: int) -> _Cycles:
    """Connect and disconnect ``cycles`` times; every 100th cycle asks for the status first
    (so the controller is seen serving throughout)."""
    result, started = _Cycles(), time.monotonic()
    request = protocol.encode(protocol.StatusRequest())
    for i in range(cycles):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(path))
                if i % 100 == 0:
                    sock.sendall(request)
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = sock.recv(1 << 16)
                        if not chunk:
                            result.unanswered += 1
                            break
                        data += chunk
        except socket.timeout:
            result.unanswered += 1
        except OSError as exc:
            result.failures[f"cycle: {exc.strerror or exc}"] += 1
        result.done += 1
    result.seconds = time.monotonic() - started
    return result


if __name__ == "__main__":
    sys.exit(main())
