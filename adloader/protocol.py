"""The wire protocol between jobs and the node controller.

Newline-delimited JSON over a Unix socket: one object per line, at most
``MAX_LINE_BYTES`` bytes, each carrying ``"v"`` (protocol version) and
``"type"``. Every message is a frozen dataclass below; :func:`decode` checks
every field's type and range and raises :class:`ProtocolError` with a code the
controller sends back in an :class:`Error` reply. Unknown fields are rejected
(a typo must not pass silently); a newer version gets ``unsupported_version``.

Counters in :class:`Report` are cumulative since the rank started, so a lost
report loses no information and a restarted controller can diff them.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, Union

from adloader.errors import ProtocolError

VERSION = 1
MAX_LINE_BYTES = 128 * 1024
MAX_STRING = 4096
MAX_LIST = 4096
MAX_NUMBER = 1e18  # larger than any real counter, small enough to stay exact-ish as float
T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    """Base of every protocol message; ``TYPE`` is the value of the ``type`` field."""

    TYPE: ClassVar[str] = ""
    # field -> (lowest, highest) allowed; checked by decode() after the types.
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {}


# ---------------------------------------------------------------- job -> controller


@dataclass(frozen=True)
class Register(Message):
    """Sent once by the launcher. The controller creates the job's cgroup and moves the
    sender (identified by SO_PEERCRED, never by a field) into it before replying."""

    TYPE: ClassVar[str] = "register"
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {
        "gpus": (0, 1024), "num_workers": (0, 1024), "samples": (0, MAX_NUMBER),
    }
    name: str
    gpus: int = 0
    num_workers: int | None = None
    features: dict[str, float] | None = None
    samples: int | None = None
    """Samples the job will process in all (its length), when the user knows it: lets
    shortest-remaining-first policies (``jct``) rank it."""


@dataclass(frozen=True)
class Report(Message):
    """Sent by each rank's loader about once a second; answered with a :class:`Target`.
    All counters are cumulative since the rank's loader started."""

    TYPE: ClassVar[str] = "report"
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {
        "rank": (0, 1 << 20), "world_size": (1, 1 << 20), "batch_size": (1, 1 << 30),
        "samples": (0, MAX_NUMBER), "batches": (0, MAX_NUMBER), "data_wait_s": (0, MAX_NUMBER),
        "compute_s": (0, MAX_NUMBER), "worker_cpu_s": (0, MAX_NUMBER), "read_bytes": (0, MAX_NUMBER),
        "worker_load_s": (0, MAX_NUMBER), "num_workers": (0, 1024),
    }
    job_id: str
    rank: int = 0
    world_size: int = 1
    batch_size: int = 1
    samples: int = 0
    batches: int = 0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    worker_cpu_s: float = 0.0
    read_bytes: int = 0
    worker_load_s: float = 0.0
    """Wall seconds the loader spent loading batches, summed over its workers (or its training
    thread with no worker): over a window, the batches being loaded at once."""
    num_workers: int = 0
    features: dict[str, float] | None = None
    """The job's model features (``adloader.describe_model``), sent with its reports until
    the controller has answered one: it predicts M from them when the launcher had none."""
    loader_pids: tuple[int, ...] | None = None
    """Pids of the processes this rank's loaders load in (their workers and the helpers that
    fork them). A rank kept apart from its job's CPU group has these, and nothing else it
    started, moved back in (controller/training_processes.py): a rank a framework starts as
    its child stays apart. None: a library that does not send them."""
    unmanaged_reason: str | None = None
    """Set when no loader of this rank is adloader's, in words the user reads in ``adloader
    status`` ("loader fell back to torch's (in_order=False)"): the rank still reports, so the
    controller knows it is alive and why it is unmanaged; its counters are not a loader's and
    are not used. None: the rank's loaders are managed."""


@dataclass(frozen=True)
class End(Message):
    """Sent by the launcher when its command exits."""

    TYPE: ClassVar[str] = "end"
    job_id: str
    exit_code: int = 0


@dataclass(frozen=True)
class StatusRequest(Message):
    """Ask for the node's state; anyone may ask."""

    TYPE: ClassVar[str] = "status"


@dataclass(frozen=True)
class SetPolicy(Message):
    """Change the node's policy. Root only."""

    TYPE: ClassVar[str] = "set_policy"
    policy: str


@dataclass(frozen=True)
class SetWorkers(Message):
    """Pin a job's DataLoader workers, or give them back to its policy. The job's owner (the uid
    that registered it) or root. The pin replaces only the workers of the policy's allocation
    (its cores, weight and bandwidth stay the policy's) and is still capped by what the job's
    memory holds (controller/worker_pins.py)."""

    TYPE: ClassVar[str] = "set_workers"
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {"num_workers": (1, 1 << 20)}
    job_id: str
    num_workers: int | None
    """Workers for the whole job, split evenly over its ranks (at least one a rank); None: the
    policy decides again (``adloader workers JOB auto``)."""


# ---------------------------------------------------------------- controller -> job


@dataclass(frozen=True)
class Registered(Message):
    TYPE: ClassVar[str] = "registered"
    job_id: str
    cgroup: str
    backend: str


@dataclass(frozen=True)
class Target(Message):
    """What the job should use now: its loader worker count per rank (None: keep what you
    have). CPU limits are the kernel's business (the job's cgroup), not the job's."""

    TYPE: ClassVar[str] = "target"
    num_workers: int | None = None
    reason: str | None = None
    """Why the target is what it is, in words the job prints when it is fewer workers than it
    asked for ("the policy adaptive plans 1.3 cores for this job"); None: no reason given."""


@dataclass(frozen=True)
class JobSnapshot:
    """One job as ``adloader status`` and the metrics show it. Limits are what the kernel
    accepted (the applied allocation), not merely what the policy decided."""

    job_id: str
    name: str
    uid: int
    gpus: int
    state: str
    """"starting" (registered, no loader report yet, within the controller's grace period),
    "running" (a loader of the job reports), "unmanaged" (none does: ``unmanaged_reason`` says
    why), or "gone" (being removed)."""
    launcher_pid: int
    pids: tuple[int, ...]
    cgroup: str
    registered_at: float
    """Unix time of registration."""
    ranks_reporting: int = 0
    batch_size: int | None = None
    cores: float | None = None
    cpu_weight: int | None = None
    cpus: tuple[int, ...] | None = None
    read_bps: int | None = None
    failed_to_apply: dict[str, str] = field(default_factory=dict)
    """Allocation fields the kernel refused at the last control step, with the error; they
    keep their applied value above and are retried every period."""
    scheduler: str = "none"
    """Who made the cgroups the job was started in: "slurm", "kubernetes", "systemd" or "none"."""
    cgroups: dict[str, str] = field(default_factory=dict)
    """The job's group in each hierarchy adloader manages ("cpu", "cpuset", ... on v1,
    "unified" on v2), nested below the scheduler's cgroups."""
    scheduler_cpu_limit: float | None = None
    """The most cores the job's scheduler lets it use: the tightest CPU quota on its cgroup or
    above (a pod's limit), and its cpuset's CPUs; None: no limit known."""
    workers_target: int | None = None
    workers_running: int = 0
    """Sum over ranks of the workers each loader says it runs."""
    workers_pinned: int | None = None
    """Workers, all ranks, an operator pinned the job to (``adloader workers``); None: the policy's."""
    workers_memory_limit: int | None = None
    """Most workers, all ranks, that fit in the job's memory (controller/worker_memory.py); None: not measured."""
    worker_memory_bytes: float | None = None
    """What one loader worker costs, as that cap counts it: its own pages (USS, the mean over the
    job's workers) plus ``worker_prefetch_bytes``; None: not measured."""
    worker_prefetch_bytes: float | None = None
    """Of that, its share of the job's shared memory, where the prefetched batches live."""
    worker_memory_exact: bool | None = None
    """False while the cost is a cheap upper bound (the largest worker's whole resident set), read
    instead of the exact USS while the job's memory holds twice the workers any policy gives."""
    training_processes_apart: int = 0
    """Ranks kept out of the job's CPU group, so its weight and quota act on its loaders only
    (controller/training_processes.py)."""
    achieved_sps: float | None = None
    """Samples/s over the last window, all ranks."""
    max_sps_predicted: float | None = None
    max_sps_predicted_interval: tuple[float, float] | None = None
    max_sps_measured: float | None = None
    """M measured over each rank's whole run (the M the policy plans with)."""
    cpu_s_per_sample: float | None = None
    """Loader CPU seconds per sample (p) the policy plans with: measured over the last window,
    else what an earlier controller measured (the state file), else the job's history."""
    bytes_per_sample: float | None = None
    """Bytes read from storage per sample (b), from the same sources as ``cpu_s_per_sample``."""
    loading_curve: tuple[tuple[float, float], ...] = ()
    """The loading curve the policy plans with, (cores, samples/s) points fitted to the job's
    windows (those an earlier controller saw included); empty until there are enough."""
    gpu_idle_ratio: float | None = None
    """1 - achieved/max, clipped to [0, 1]."""
    data_wait_ratio: float | None = None
    """Share of step time spent waiting for data over the last window."""
    samples_total: int = 0
    data_wait_seconds_total: float = 0.0
    compute_seconds_total: float = 0.0
    loader_cpu_seconds_total: float = 0.0
    loader_load_seconds_total: float = 0.0
    """Wall seconds the loader workers spent loading batches (its rate: batches loaded at once)."""
    read_bytes_total: int = 0
    cpu_seconds_total: float = 0.0
    """CPU time of the whole cgroup (cpuacct / cpu.stat)."""
    unmanaged_reason: str | None = None
    """Why no loader of the job is managed, in words (set when ``state`` is "unmanaged")."""
    cores_used: float | None = None
    """Cores the job's group used over the last window (what an unmanaged job's CPU share is based on)."""


@dataclass(frozen=True)
class NodeSnapshot:
    """The node at one control step: what ``adloader status``, the Prometheus exporter and
    the benchmarks read, and all they read."""

    version: str
    policy: str
    backend: str
    started_at: float
    period_s: float
    cpus: tuple[int, ...]
    read_bps: float | None
    read_device: str | None
    jobs: tuple[JobSnapshot, ...] = ()
    connected_clients: int = 0
    last_loop_seconds: float = 0.0
    reallocations_total: dict[str, int] = field(default_factory=dict)
    """Reallocations by reason ("arrival", "departure", "gain", "policy_change", "adoption")."""
    errors_total: dict[str, int] = field(default_factory=dict)
    """Protocol and internal errors by kind (the error code)."""
    state_write_failures_total: int = 0
    state_corruptions_total: int = 0
    backend_failures_total: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``adloader status --json``); :func:`decode_object` reads it back."""
        return plain(self)


@dataclass(frozen=True)
class Status(Message):
    TYPE: ClassVar[str] = "status_reply"
    node: NodeSnapshot


@dataclass(frozen=True)
class Ok(Message):
    TYPE: ClassVar[str] = "ok"


@dataclass(frozen=True)
class Error(Message):
    """Error reply: ``code`` is machine-readable, ``message`` says what was wrong and what to do."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (Register, Report, End, StatusRequest, SetPolicy, SetWorkers, Registered, Target, Status, Ok, Error)
}


# ---------------------------------------------------------------- encode / decode


def encode(message: Message) -> bytes:
    """One line of JSON, newline-terminated. Raises ProtocolError if it would exceed the bound."""
    payload = {"v": VERSION, "type": message.TYPE, **_fields_of(message)}
    line = json.dumps(payload, separators=(",", ":"), allow_nan=False, default=_fields_of).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError("too_long", f"message of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    return line


_LEAVES = frozenset({str, int, float, bool, type(None)})
"""Types ``plain`` returns as they are, checked first: most values of a snapshot or of the
state file are numbers (each job's loading curve), and asking each whether it is a
dataclass was most of the cost of converting one."""


def plain(value: Any) -> Any:
    """A tree of dataclasses, lists and dicts as JSON-ready builtins, for what is kept or
    printed as JSON (``NodeSnapshot.to_dict``, the state file); messages are encoded without
    it (:func:`encode`). Unlike ``dataclasses.asdict`` it copies nothing it does not convert."""
    kind = type(value)
    if kind in _LEAVES:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: plain(getattr(value, name)) for name in _fields(kind)}
    return value


def _fields_of(value: Any) -> dict[str, Any]:
    """json's hook for what it cannot encode itself: a dataclass as its fields, unconverted
    (json's C encoder walks the lists and numbers they hold; converting the whole tree in
    Python first was most of the cost of a status reply)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: getattr(value, name) for name in _fields(type(value))}
    raise TypeError(f"{type(value).__name__} cannot be sent in a message")


@functools.cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    """A dataclass's fields by name, computed once per class."""
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A message class's resolved type hints, computed once per class (decode checks them)."""
    return typing.get_type_hints(cls)


def decode(line: bytes | str) -> Message:
    """Parse and validate one line. Raises ProtocolError(code, message) on anything wrong."""
    if isinstance(line, bytes):
        if len(line) > MAX_LINE_BYTES:
            raise ProtocolError("too_long", f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("bad_encoding", f"line is not UTF-8: {exc.reason} at byte {exc.start}") from None
    else:
        text = line
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ProtocolError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("bad_json", f"line is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("not_object", f"a message must be a JSON object, got {type(obj).__name__}")
    version = obj.pop("v", None)
    if type(version) is not int:
        raise ProtocolError("bad_version", "field 'v' (protocol version, an integer) is missing")
    if version != VERSION:
        raise ProtocolError(
            "unsupported_version", f"protocol version {version} is not supported; this side speaks {VERSION}"
        )
    kind = obj.pop("type", None)
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("unknown_type", f"unknown message type {str(kind)[:64]!r}; known: {sorted(MESSAGE_TYPES)}")
    return _build(cls, obj, cls.TYPE)


def decode_object(cls: type[T], obj: Any, where: str) -> T:
    """Build the dataclass ``cls`` from a JSON object with the same checks as :func:`decode`
    (every field's type, nested dataclasses, ranges, unknown and missing fields): the one
    typed decoder for the wire and for the controller's state file. ``where`` names the
    object in error messages ("jobs.j1a2b3c4")."""
    if not isinstance(obj, dict):
        raise _type_error(where, "an object", obj)
    return _build(cls, obj, where)


def _reject_constant(name: str) -> Any:
    raise ProtocolError("bad_number", f"{name} is not allowed in messages")


def _build(cls: type[T], obj: dict[str, Any], where: str) -> T:
    fields, hints = _fields(cls), _hints(cls)
    unknown = set(obj) - set(fields)
    if unknown:
        raise ProtocolError("unknown_field", f"{where}: unknown field(s) {sorted(unknown)[:8]}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError("missing_field", f"{where}: required field {name!r} is missing")
            continue
        kwargs[name] = _check(obj[name], hints[name], f"{where}.{name}")
    for name, (low, high) in getattr(cls, "RANGES", {}).items():
        value = kwargs.get(name)
        if value is not None and not low <= value <= high:
            raise ProtocolError("bad_number", f"{where}.{name}={value} is outside [{low:g}, {high:g}]")
    return cls(**kwargs)


def _check(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(value, inner[0], where)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _type_error(where, "an object", value)
        return _build(hint, value, where)
    if hint is str:
        if not isinstance(value, str):
            raise _type_error(where, "a string", value)
        if len(value) > MAX_STRING or "\x00" in value:
            raise ProtocolError("bad_field", f"{where}: string too long or contains NUL")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _type_error(where, "a boolean", value)
        return value
    if hint is int:
        if type(value) is not int:
            raise _type_error(where, "an integer", value)
        if not -MAX_NUMBER <= value <= MAX_NUMBER:
            raise ProtocolError("bad_number", f"{where}: {value} is out of range")
        return value
    if hint is float:
        if type(value) not in (int, float):
            raise _type_error(where, "a number", value)
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:
            raise ProtocolError("bad_number", f"{where}: {value} is not a finite number in range")
        return float(value)
    if origin is list:
        if not isinstance(value, list):
            raise _type_error(where, "a list", value)
        if len(value) > MAX_LIST:
            raise ProtocolError("bad_field", f"{where}: list longer than {MAX_LIST}")
        return [_check(item, args[0], f"{where}[]") for item in value]
    if origin is tuple:
        if not isinstance(value, list):
            raise _type_error(where, "a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            if len(value) > MAX_LIST:
                raise ProtocolError("bad_field", f"{where}: list longer than {MAX_LIST}")
            return tuple(_check(item, args[0], f"{where}[]") for item in value)
        if len(value) != len(args):
            raise ProtocolError("bad_field", f"{where} must hold {len(args)} items, got {len(value)}")
        return tuple(_check(item, arg, f"{where}[{i}]") for i, (item, arg) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(where, "an object", value)
        if len(value) > MAX_LIST:
            raise ProtocolError("bad_field", f"{where}: object with more than {MAX_LIST} keys")
        return {_check(k, str, f"{where} key"): _check(v, args[1], f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"protocol field type {hint!r} at {where} is not supported")  # programming error


def _type_error(where: str, expected: str, value: Any) -> ProtocolError:
    return ProtocolError("bad_field", f"{where} must be {expected}, got {type(value).__name__}")
