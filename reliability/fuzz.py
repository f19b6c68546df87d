"""Malformed input for the controller's socket, and what each line must get back.

Lines come from three sources:
  * :func:`mutated_lines`: valid messages of every type (requests and replies, with the
    node's real job ids) broken at the byte level (flips, inserts, cuts, splices,
    invalid UTF-8, NUL bytes) and at the JSON level (a field set to NaN, a huge or
    negative number, a 5000-digit integer, the wrong type, deep nesting; fields dropped,
    renamed or added; the version or type changed; the object wrapped);
  * :func:`line_strategy`: hypothesis strategies for arbitrary JSON documents shaped like
    messages, arbitrary bytes, and non-objects;
  * :data:`SPECIAL_LINES` and the connection-level abuse in :class:`FuzzDriver` (a line
    far over the limit, half a line then close, connect and close, send and close
    without reading).

:func:`expected` is the oracle: what the controller must answer to one line, following
the protocol's rules (adloader/protocol.py decides what a malformed line is; the
controller must answer exactly that, once, in order). Lines that are valid requests
which would legitimately change the node (Register; End of a listed job; SetPolicy to
an installed policy) are not sent: the fuzzer checks that nothing else changes state.
"""
from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import psutil

from adloader import protocol
from adloader.errors import ProtocolError
from bench.controller_process import ControllerProcess, poll
from reliability.node import Node, TrackedJob
from controller.snapshot import NodeSnapshot

MAX = protocol.MAX_LINE_BYTES
WEIRD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1.5, -0.0, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63), 10**18, 10**18 + 1, 1e18,
    1e19, 1e308, float("nan"), float("inf"), float("-inf"), "", "x" * 5000, "\x00", "nul\x00inside", "\u2028",
    "../../etc", [], {}, [1, 2], {"a": 1}, {"": None}, list(range(5000)), {"k": [[[]]]},
)
"""Values put in place of a field: wrong types, out of range, non-finite, over the size bounds."""
RAW_VALUES: tuple[bytes, ...] = (
    b"1" + b"0" * 5000, b"1e99999", b"-1e99999", b"1E400", b"-0", b"NaN", b"Infinity", b"-Infinity", b"0x10",
    b"01", b"1.", b".5", b"+1", b"'single'", b'"\\ud800"', b'"\\u0000"', b"tru", b"nul", b"[" * 3000 + b"]" * 3000,
)
"""Raw JSON (or almost-JSON) text put in place of a field's value."""
INVALID_UTF8: tuple[bytes, ...] = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                   b"\xc0\xaf", b"\xe2\x82")
SPECIAL_LINES: tuple[bytes, ...] = (
    b"", b" ", b"\r", b"\t", b"\x00", b"[]", b"1", b'"s"', b"null", b"true", b"{}", b'{"v":1}', b'{"type":"status"}',
    b'{"v":1,"type":"status"', b'{"v":1,"type":"status"}}', b'{"v":1,"type":"status"} {"v":1,"type":"status"}',
    b'{"v":1,"type":"status","type":"report"}', b'{"v":true,"type":"status"}', b'{"v":1.0,"type":"status"}',
    b"[" * 60_000 + b"]" * 60_000, b'{"a":' * 20_000 + b"1" + b"}" * 20_000, b'"' + b"x" * (MAX - 10) + b'"',
    b"x" * (MAX + 1),
)
"""Lines every run sends: empty, non-objects, duplicate keys, deep nesting, just under and at the bound."""


@dataclass(frozen=True)
class Expected:
    code: str | None
    """The Error code the line must get, or None for a successful reply."""
    reply: str = "error"
    """The reply's type."""
    closes: bool = False
    """The controller must close the connection after replying (the line could not be framed)."""


def expected(line: bytes, jobs: set[str], policies: set[str]) -> Expected | None:
    """What the controller must answer to ``line`` (sent with a newline after it) from a root
    process that belongs to no job; None if the line must not be sent (it would change the
    node legitimately)."""
    if len(line) > MAX + 1:  # no newline within the reader's limit: it cannot be framed
        return Expected("too_long", closes=True)
    try:
        message = protocol.decode(line.rstrip(b"\r\n"))
    except ProtocolError as exc:
        return Expected(exc.code)
    if isinstance(message, protocol.StatusRequest):
        return Expected(None, "status_reply")
    if isinstance(message, protocol.Report):
        return Expected("forbidden" if message.job_id in jobs else "unknown_job")
    if isinstance(message, protocol.End):
        return None if message.job_id in jobs else Expected("unknown_job")
    if isinstance(message, protocol.SetPolicy):
        return None if message.policy in policies else Expected("bad_policy")
    if isinstance(message, protocol.Register):
        return None
    return Expected("unknown_type")  # a reply type sent as a request


def templates(job_ids: Iterable[str]) -> list[bytes]:
    """Valid lines of every message type, naming the node's jobs and some that do not exist."""
    ids = list(job_ids) + ["j00000000", "jdeadbeef"]
    features = {"flops": 4.1e9, "params": 2.5e7, "batch": 256.0}
    messages: list[protocol.Message] = [
        protocol.StatusRequest(), protocol.SetPolicy(policy="even"), protocol.SetPolicy(policy="no-such-policy"),
        protocol.Register(name="resnet50", gpus=4, num_workers=8, features=features), protocol.Register(name="x"),
        protocol.Registered(job_id=ids[0], cgroup="/sys/fs/cgroup/cpu/adloader/j1", backend="cgroup-v1"),
        protocol.Target(num_workers=3), protocol.Ok(), protocol.Error(code="bad_json", message="no"),
        protocol.Status(node=protocol.NodeSnapshot(
            version="0", policy="even", backend="cgroup-v1", started_at=0.0, period_s=1.0, cpus=(0,), read_bps=None,
            read_device=None, jobs=(protocol.JobSnapshot(job_id=ids[0], name="x", uid=0, gpus=1, state="running",
                                                         launcher_pid=1, pids=(1,), cgroup="g", registered_at=0.0),),
        )),
    ]
    for job_id in ids:
        messages += [
            protocol.Report(job_id=job_id, rank=1, world_size=4, batch_size=64, samples=6400, batches=100,
                            data_wait_s=1.5, compute_s=9.0, worker_cpu_s=30.0, read_bytes=10**9, num_workers=4,
                            features=features),
            protocol.Report(job_id=job_id),
            protocol.End(job_id=job_id, exit_code=1),
        ]
    return [protocol.encode(m).rstrip(b"\n") for m in messages]


# ---------------------------------------------------------------- mutations


def _byte_flip(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    data = bytearray(line or b" ")
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _insert_bytes(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    at = rng.randint(0, len(line))
    return line[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + line[at:]


def _delete_span(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    at = rng.randint(0, len(line))
    return line[:at] + line[at + rng.randint(1, 16):]


def _truncate(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    return line[: rng.randint(0, len(line))]


def _duplicate_span(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    at = rng.randint(0, len(line))
    span = line[at: at + rng.randint(1, 32)]
    return line[:at] + span * rng.randint(2, 50) + line[at:]


def _splice(rng: random.Random, line: bytes, others: list[bytes]) -> bytes:
    other = rng.choice(others)
    return line[: rng.randint(0, len(line))] + other[rng.randint(0, len(other)):]


def _invalid_utf8(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    at = rng.randint(0, len(line))
    return line[:at] + rng.choice(INVALID_UTF8) + line[at:]


def _nul_byte(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    at = rng.randint(0, len(line))
    return line[:at] + rng.choice((b"\x00", b"\\u0000")) + line[at:]


def _json_field(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    """Set, drop, rename or add one field (``v`` and ``type`` included)."""
    message = _object(line)
    key = rng.choice(sorted(message))
    action = rng.randrange(5)
    if action == 0:
        message[key] = rng.choice(WEIRD_VALUES)
    elif action == 1:
        del message[key]
    elif action == 2:
        message[key + rng.choice(("_", "X", " "))] = message.pop(key)
    elif action == 3:
        message[rng.choice(("extra", "uid", "pid", "job", "__proto__", ""))] = rng.choice(WEIRD_VALUES)
    else:
        message[key] = _nested(rng.choice((2, 40, 1000)), rng.choice(WEIRD_VALUES[:6]))
    return _dumps(message)


def _raw_value(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    """Put raw (non-JSON, or JSON that Python cannot hold) text in place of one field's value."""
    message = _object(line)
    key = rng.choice(sorted(message))
    marker = "@@RAW@@"
    message[key] = marker
    return _dumps(message).replace(json.dumps(marker).encode(), rng.choice(RAW_VALUES))


def _wrap(rng: random.Random, line: bytes, _: list[bytes]) -> bytes:
    return rng.choice((b"[" + line + b"]", json.dumps(line.decode()).encode(), b'{"msg":' + line + b"}",
                       line + b"," + line, line * 2))


MUTATORS: tuple[Callable[[random.Random, bytes, list[bytes]], bytes], ...] = (
    _byte_flip, _insert_bytes, _delete_span, _truncate, _duplicate_span, _splice, _invalid_utf8, _nul_byte,
    _json_field, _json_field, _raw_value, _wrap,
)


def _object(line: bytes) -> dict[str, Any]:
    """The JSON object in ``line``; ValueError if an earlier mutation left something else."""
    message = json.loads(line)
    if not isinstance(message, dict) or not message:
        raise ValueError("not a JSON object with fields")
    return message


def _nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _dumps(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()  # allow_nan: NaN and Infinity appear as such


def mutated_lines(rng: random.Random, valid: list[bytes], count: int) -> Iterator[bytes]:
    """``count`` lines, each a valid line broken by one to three mutations."""
    for _ in range(count):
        line = rng.choice(valid)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            mutate = rng.choice(MUTATORS)
            try:
                line = mutate(rng, line, valid)
            except (ValueError, RecursionError, IndexError):  # a JSON-level mutation of a line no longer JSON
                line = _byte_flip(rng, line, valid)
        yield line.replace(b"\n", b" ")


# ---------------------------------------------------------------- hypothesis


def line_strategy() -> Any:
    """A hypothesis strategy for one line: a message-shaped JSON object with arbitrary
    fields and values, a non-object JSON document, or arbitrary bytes."""
    from hypothesis import strategies as st

    scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
               | st.text(max_size=20))
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
    names = sorted({f for cls in protocol.MESSAGE_TYPES.values() for f in cls.__dataclass_fields__})
    messages = st.builds(
        lambda v, kind, fields: {"v": v, "type": kind, **fields},
        st.one_of(st.just(protocol.VERSION), values),
        st.one_of(st.sampled_from(sorted(protocol.MESSAGE_TYPES)), values),
        st.dictionaries(st.one_of(st.sampled_from(names), st.text(max_size=8)), values, max_size=6),
    )
    as_line = lambda document: json.dumps(document, separators=(",", ":")).encode()  # noqa: E731
    return st.one_of(messages.map(as_line), values.map(as_line), st.binary(max_size=200)).map(
        lambda line: line.replace(b"\n", b" "))


def run_hypothesis(send: Callable[[list[bytes]], None], examples: int, batch: int = 32, seed: int = 0) -> None:
    """Feed ``send`` ``examples`` batches of hypothesis-generated lines (more while shrinking
    a failure; ``send`` raises AssertionError on a wrong answer)."""
    from hypothesis import HealthCheck, given, settings, strategies as st
    from hypothesis import seed as fixed_seed

    @fixed_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(line_strategy(), min_size=batch // 2, max_size=batch))
    def feed(lines: list[bytes]) -> None:
        send(lines)

    feed()


# ---------------------------------------------------------------- the driver


@dataclass
class FuzzDriver:
    """Sends lines to the controller over one connection (a fresh one after each close),
    pipelined in batches, and checks every reply against :func:`expected`."""

    socket_path: Path
    jobs: set[str]
    policies: set[str]
    timeout: float = 30.0
    sent: int = 0
    skipped: int = 0
    sessions: int = 0
    """Connection-level abuses (half a line then close, connect and close, no read)."""
    errors: Counter = field(default_factory=Counter)
    """Error replies by code, as the controller should have counted them."""
    wrong: list[str] = field(default_factory=list)
    _sock: socket.socket | None = None
    _buffer: bytes = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send(self, lines: list[bytes]) -> None:
        """Send ``lines`` (no newlines inside), check the replies; AssertionError at the first wrong one."""
        before = len(self.wrong)
        batch: list[tuple[bytes, Expected]] = []
        for line in lines:
            outcome = expected(line, self.jobs, self.policies)
            if outcome is None:
                self.skipped += 1
                continue
            if outcome.closes:
                self._flush(batch)
                batch = []
                self._flush([(line, outcome)])
                continue
            batch.append((line, outcome))
        self._flush(batch)
        if len(self.wrong) > before:
            raise AssertionError(self.wrong[before])

    def _connection(self) -> socket.socket:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(self.timeout)
            self._sock.connect(str(self.socket_path))
            self._buffer = b""
        return self._sock

    def _flush(self, batch: list[tuple[bytes, Expected]]) -> None:
        if not batch:
            return
        sock = self._connection()
        try:
            sock.sendall(b"".join(line + b"\n" for line, _ in batch))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the controller closed after a too_long line; its reply is still to be read
        for line, outcome in batch:
            self.sent += 1
            reply = self._read_reply()
            self._check(line, outcome, reply)
            if outcome.code is not None:
                self.errors[outcome.code] += 1
            if reply is None or outcome.closes:
                self.close()
                if reply is None:
                    return

    def _read_reply(self) -> bytes | None:
        assert self._sock is not None
        while b"\n" not in self._buffer:
            try:
                chunk = self._sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk
        reply, self._buffer = self._buffer.split(b"\n", 1)
        return reply

    def _check(self, line: bytes, outcome: Expected, reply: bytes | None) -> None:
        shown = line[:120] + (b"..." if len(line) > 120 else b"")
        if reply is None:
            self.wrong.append(f"{shown!r}: the connection closed without a reply (expected {outcome})")
            return
        try:
            message = protocol.decode(reply)
        except ProtocolError as exc:
            self.wrong.append(f"{shown!r}: the reply is not a valid message ({exc}): {reply[:200]!r}")
            return
        got = getattr(message, "code", None) if isinstance(message, protocol.Error) else None
        if message.TYPE != outcome.reply or got != outcome.code:
            self.wrong.append(f"{shown!r}: got {message.TYPE} {got}, expected {outcome.reply} {outcome.code}")

    # -- connection-level abuse -------------------------------------------------------------------
    def abuse_connections(self, rng: random.Random, count: int, valid: list[bytes]) -> None:
        """``count`` connections that misbehave: half a line then close, connect then close,
        a request sent and the connection closed before the reply is read, and a line far
        over the limit (too_long, then closed by the controller)."""
        for i in range(count):
            kind = i % 4
            if kind == 3:
                line = b"{" + b"x" * rng.randint(2 * MAX, 8 * MAX)
                self.send([line])
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(str(self.socket_path))
                if kind == 0:
                    line = rng.choice(valid)
                    sock.sendall(line[: rng.randint(0, len(line) - 1)])
                elif kind == 2:
                    sock.sendall(protocol.encode(protocol.StatusRequest()))
            self.sessions += 1


# ---------------------------------------------------------------- a whole run


class StatusPoller(threading.Thread):
    """A well-behaved client asking for the node's status in a loop, timing each answer."""

    def __init__(self, controller: ControllerProcess, pause_s: float = 0.05) -> None:
        super().__init__(name="status-poller", daemon=True)
        self.controller, self.pause_s = controller, pause_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.pause_s):
            started = time.monotonic()
            try:
                self.controller.status()
            except Exception as exc:  # noqa: BLE001 - every failure is a finding to report
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            self.latencies.append(time.monotonic() - started)

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=30)


@dataclass
class FuzzReport:
    lines: int
    """Lines sent and answered (the oracle's skips excluded)."""
    sessions: int
    skipped: int
    errors_by_code: dict[str, int]
    seconds: float
    rss_before: int
    rss_after: int
    bystander_status_requests: int
    bystander_status_p99_s: float | None
    bystander_reports_during: int
    violations: list[str]

    @property
    def messages(self) -> int:
        return self.lines + self.sessions


def run_fuzz(node: Node, bystander: TrackedJob, mutations: int, examples: int, sessions: int,
             seed: int = 8) -> FuzzReport:
    """Send SPECIAL_LINES, ``mutations`` mutated lines, ``examples`` hypothesis batches and
    ``sessions`` abusive connections to ``node``'s controller while ``bystander`` (a
    reporting job) and a status poller go on, then check that every line got its answer,
    that the controller counted exactly those errors, that nothing else changed, that its
    memory stayed bounded and that the well-behaved clients were never refused or kept waiting."""
    from reliability.job import parse_progress
    from controller.policies import policy_names

    controller = node.controller
    process = psutil.Process(controller.proc.pid)
    progress_before = poll(lambda: (lambda p: p if p is not None and p.reports_ok else None)(
        parse_progress(bystander.handle.output()[0])), 30)
    if progress_before is None:
        return FuzzReport(0, 0, 0, {}, 0.0, 0, 0, 0, None, 0, ["the reporting job never got a report through"])
    before, rss_before = controller.status(), process.memory_info().rss
    rng = random.Random(seed)
    valid = templates({j.job_id for j in before.jobs})
    driver = FuzzDriver(controller.socket, {j.job_id for j in before.jobs}, set(policy_names()))
    poller = StatusPoller(controller)
    poller.start()
    started = time.monotonic()
    violations: list[str] = []
    try:
        driver.send(list(SPECIAL_LINES))
        lines = list(mutated_lines(rng, valid, mutations))
        for at in range(0, len(lines), 64):
            driver.send(lines[at: at + 64])
        run_hypothesis(driver.send, examples, seed=seed)
        driver.abuse_connections(rng, sessions, valid)
    except AssertionError:
        pass  # recorded in driver.wrong
    finally:
        driver.close()
        poller.finish()
    seconds = time.monotonic() - started
    violations += driver.wrong[:20]
    violations += [f"a well-behaved status request failed: {f}" for f in poller.failures[:5]]
    after = poll(lambda: (lambda s: s if s.connected_clients == before.connected_clients else None)(controller.status()),
                 10) or controller.status()
    if after.connected_clients != before.connected_clients:
        violations.append(f"{after.connected_clients} clients connected after the fuzz, {before.connected_clients} before")
    counted = Counter({k: v - before.errors_total.get(k, 0) for k, v in after.errors_total.items()})
    if +counted != +driver.errors:
        violations.append(f"the controller counted errors {dict(+counted)}, the lines deserved {dict(driver.errors)}")
    if _node_picture(after) != _node_picture(before):
        violations.append(f"the node changed: {_node_picture(before)} -> {_node_picture(after)}")
    progress_after = parse_progress(bystander.handle.output()[0])
    reports = (progress_after.reports_ok - progress_before.reports_ok) if progress_after and progress_before else 0
    if progress_after is None or progress_after.refused or progress_after.unavailable or reports <= 0:
        violations.append(f"the reporting job was disturbed: {progress_before} -> {progress_after}")
    if controller.proc.poll() is not None:
        violations.append(f"the controller exited with {controller.proc.returncode}")
    latencies = sorted(poller.latencies)
    return FuzzReport(
        lines=driver.sent, sessions=driver.sessions, skipped=driver.skipped, errors_by_code=dict(driver.errors),
        seconds=seconds, rss_before=rss_before, rss_after=process.memory_info().rss,
        bystander_status_requests=len(latencies),
        bystander_status_p99_s=latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        bystander_reports_during=reports, violations=violations,
    )


def _node_picture(status: NodeSnapshot) -> tuple:
    """What a malformed message must not change: the policy, the jobs and their allocations."""
    return (status.policy, tuple((j.job_id, j.name, j.uid, j.cores, j.cpus, j.workers_target) for j in status.jobs))
