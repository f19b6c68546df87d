"""Load on the controller's socket: many reporting clients, connection churn, slow clients.

Two halves:
  * ``python -m reliability.load --connections C --seconds S`` is a job's command
    (run it under ``adloader run``): C asyncio connections from inside the job's cgroup,
    each a rank reporting about once per ``--interval`` seconds, each reply timed. It
    prints one JSON line of :class:`ClientFigures` when done;
  * :func:`run_load` drives a node: it holds slow clients (half a line written, never
    finished until the end), starts the load jobs, runs connect/disconnect cycles beside
    them, samples the controller's file descriptors, memory and CPU, and checks that
    nobody was kept waiting and that the descriptors went back to the baseline;
    with ``echo``, every rank also sends each report to a server that only sends canned
    replies (``--echo PATH``), half an interval later: on a shared machine, what the
    machine itself adds to a reply's latency, measured under the same load.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from adloader import env, paths, protocol
from adloader.errors import ProtocolError
from bench.controller_process import poll
from reliability.node import Node

SLOW_PREFIX = b'{"v":1,"type":"sta'
"""What a slow client writes, and then holds: half of a status request."""
SLOW_REPLY_MS = 500.0


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
    echo_latencies_ms: list[float] = field(default_factory=list)
    """The same reports' replies from the canned-reply server (``--echo-socket``)."""
    slow_replies: list[tuple[float, float]] = field(default_factory=list)
    """(Unix time sent, milliseconds) of each reply slower than SLOW_REPLY_MS: when the stalls were."""


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------- the job side


class _Channel:
    """One rank's connection to one server, timing each request's reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latencies: list[float]) -> None:
        self.reader, self.writer, self.latencies = reader, writer, latencies

    @classmethod
    async def open(cls, path: str, latencies: list[float]) -> "_Channel":
        reader, writer = await asyncio.open_unix_connection(path, limit=protocol.MAX_LINE_BYTES + 1)
        return cls(reader, writer, latencies)

    async def ask(self, line: bytes, timeout: float) -> bytes | None:
        """Send ``line``; the reply line (timed), b"" if the server closed, None on timeout."""
        started = time.perf_counter()
        self.writer.write(line)
        try:
            reply = await asyncio.wait_for(self.reader.readline(), timeout)
        except asyncio.TimeoutError:
            return None
        if reply:
            self.latencies.append((time.perf_counter() - started) * 1000)
        return reply


async def _rank(rank: int, world: int, job_id: str, path: str, echo_path: str | None, seconds: float,
                interval: float, timeout: float, figures: ClientFigures, failures: Counter) -> None:
    """Report every ``interval`` seconds to the controller at ``path`` and, half an interval
    later, the same report to the canned-reply server at ``echo_path`` (when given): both
    are timed under the same machine load."""
    try:
        controller = await _Channel.open(path, figures.latencies_ms)
        echo = await _Channel.open(echo_path, figures.echo_latencies_ms) if echo_path else None
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
            line = protocol.encode(protocol.Report(job_id=job_id, rank=rank, world_size=world, batch_size=32,
                                                   samples=samples, batches=samples // 32, compute_s=samples / 3200,
                                                   num_workers=1))
            figures.requests += 1
            sent_at = time.time()
            reply = await controller.ask(line, timeout)
            if reply is None:
                figures.timeouts += 1
                return
            if not reply:
                failures["closed by the controller"] += 1
                return
            figures.replies += 1
            if controller.latencies[-1] > SLOW_REPLY_MS:
                figures.slow_replies.append((round(sent_at, 3), round(controller.latencies[-1], 1)))
            try:
                decoded = protocol.decode(reply.rstrip(b"\n"))
            except ProtocolError as exc:
                failures[f"bad reply: {exc.code}"] += 1
                continue
            if isinstance(decoded, protocol.Error):
                failures[f"error reply: {decoded.code}"] += 1
            if echo is not None:
                await asyncio.sleep(max(0.0, next_at - interval / 2 - time.monotonic()))
                if not await echo.ask(line, timeout):
                    failures["the canned-reply server did not answer"] += 1
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    except (ConnectionError, OSError) as exc:
        failures[f"connection: {type(exc).__name__}"] += 1
    finally:
        controller.writer.close()
        if echo is not None:
            echo.writer.close()


async def _load(connections: int, seconds: float, interval: float, timeout: float, path: str,
                echo_path: str | None) -> ClientFigures:
    job_id = env.job_id()
    figures, failures = ClientFigures(), Counter()
    if job_id is None:
        figures.failures = {"not managed: ADLOADER_JOB_ID unset": 1}
        return figures
    await asyncio.gather(*(_rank(rank, connections, job_id, path, echo_path, seconds, interval, timeout, figures,
                                 failures) for rank in range(connections)))
    figures.failures = dict(failures)
    return figures


async def _echo(path: str) -> None:
    """The cheapest server that speaks the protocol: every line gets a canned reply at once
    (a status reply to a status request, a target to anything else). The baseline that shows
    what the machine itself adds to a reply's latency."""
    status, target = protocol.encode(protocol.Status(node=protocol.NodeSnapshot(
        version="0", policy="even", backend="echo", started_at=0.0, period_s=1.0, cpus=(0,), read_bps=None,
        read_device=None))), protocol.encode(protocol.Target(num_workers=1))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(status if b'"status"' in line else target)
                await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, path=path, limit=protocol.MAX_LINE_BYTES + 1)
    os.chmod(path, 0o666)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Report to the controller from many connections (a load job).")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between one rank's reports")
    parser.add_argument("--timeout", type=float, default=10.0, help="a reply later than this is a blocked client")
    parser.add_argument("--echo-socket", default=None, metavar="PATH",
                        help="also send each report to the canned-reply server at PATH, half an interval later")
    parser.add_argument("--echo", default=None, metavar="PATH", help="instead, serve canned replies on PATH")
    args = parser.parse_args(argv)
    raise_fd_limit()
    if args.echo:
        asyncio.run(_echo(args.echo))
        return 0
    figures = asyncio.run(_load(args.connections, args.seconds, args.interval, args.timeout,
                                str(paths.default_socket_path()), args.echo_socket))
    figures.latencies_ms = [round(x, 3) for x in figures.latencies_ms]
    figures.echo_latencies_ms = [round(x, 3) for x in figures.echo_latencies_ms]
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
    echo_p50_ms: float | None
    """The same clients' reports to a canned-reply server, interleaved (None: not measured)."""
    echo_p99_ms: float | None
    violations: list[str]


def run_load(node: Node, jobs: int, connections: int, seconds: float, cycles: int, slow_clients: int,
             interval: float = 1.0, echo: bool = False) -> LoadReport:
    """``jobs`` load jobs of ``connections`` reporting ranks each for ``seconds``, with
    ``cycles`` connect/disconnect cycles and ``slow_clients`` half-written lines alongside.
    With ``echo``, each rank also sends every report to a canned-reply server half an
    interval later, so the report shows what the machine alone adds to a reply's latency."""
    with tempfile.TemporaryDirectory(prefix="adl-echo-") as directory:
        echo_path = os.path.join(directory, "echo.sock") if echo else None
        server = _start_echo(echo_path, node.controller.environ) if echo_path else None
        try:
            return _run_load(node, jobs, connections, seconds, cycles, slow_clients, interval, echo_path)
        finally:
            if server is not None:
                server.kill()
                server.wait()


def _start_echo(path: str, environ: dict[str, str]) -> subprocess.Popen:
    os.chmod(os.path.dirname(path), 0o755)
    server = subprocess.Popen([sys.executable, "-m", "reliability.load", "--echo", path],
                              cwd=Path(__file__).resolve().parents[1], env=environ)
    poll(lambda: os.path.exists(path) or server.poll() is not None, 30)
    return server


def _run_load(node: Node, jobs: int, connections: int, seconds: float, cycles: int, slow_clients: int,
              interval: float, echo_path: str | None) -> LoadReport:
    raise_fd_limit()
    controller = node.controller
    process = psutil.Process(controller.proc.pid)
    fds_baseline, rss_baseline = process.num_fds(), process.memory_info().rss
    cpu_before = sum(process.cpu_times()[:2])
    sampler = ControllerSampler(process.pid)
    sampler.start()
    slow = [_slow_client(controller.socket) for _ in range(slow_clients)]
    started = time.monotonic()
    echo = ("--echo-socket", echo_path) if echo_path else ()
    load_jobs = [node.controller.run(sys.executable, "-m", "reliability.load", "--connections",
                                     str(connections), "--seconds", str(seconds), "--interval", str(interval), *echo,
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
    echo_latencies = sorted(x for f in figures for x in f.echo_latencies_ms)
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
        controller_cpu_percent=cpu_percent, echo_p50_ms=_quantile(echo_latencies, 0.50),
        echo_p99_ms=_quantile(echo_latencies, 0.99), violations=violations,
    )


def second_round_rss(node: Node, cycles: int) -> int:
    """The controller's RSS after ``cycles`` more connect/disconnect cycles on an idle node:
    if connections leaked memory it would grow again; if it stays, what the load left is
    the allocator keeping its pages, not a leak."""
    _cycle_connections(node.controller.socket, cycles)
    return psutil.Process(node.controller.proc.pid).memory_info().rss


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
