"""Start the controller on a damaged state file, and run it on a state directory that
cannot be written.

A damaged file (truncated at any length, checksum wrong, edited, from a newer version,
not ours, a temp file left by a crash during a save) must never stop the controller
from starting: it moves the file aside (``state.json.corrupt-*``), rebuilds its state
from the cgroup tree and the live processes, logs it and counts it
(``state_corruptions_total``), and every live job is adopted as after any restart.

Whether a variant is usable is decided here from the bytes alone, not by asking the
state store: a truncation is harmless only if it removed nothing but trailing whitespace.
"""
from __future__ import annotations

import json
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from adloader import protocol
from bench.controller_process import HarnessError, poll
from reliability.node import Node

STATE_FILE = "state.json"
TEMP_FILE = "state.json.tmp"


@dataclass(frozen=True)
class StateVariant:
    label: str
    content: bytes
    """What state.json holds when the controller starts."""
    usable: bool
    """A correct loader can use it (no corruption to count)."""
    temp: bytes | None = None
    """A leftover state.json.tmp beside it, as a crash during a save leaves."""


def state_variants(original: bytes, lengths: Iterable[int]) -> list[StateVariant]:
    """Truncations of ``original`` (a real state file) at ``lengths``, plus every other kind of damage."""
    variants = [
        StateVariant(f"truncated to {n} of {len(original)} bytes", original[:n],
                     usable=original[:n].strip() == original.strip())
        for n in lengths
    ]
    document = json.loads(original)

    def dumped(doc: dict) -> bytes:
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    bad_checksum = dict(document, checksum="sha256:" + "0" * 64)
    edited = json.loads(original)
    edited["payload"]["policy"] = "static" if edited["payload"]["policy"] != "static" else "even"
    future = dict(document, version=document["version"] + 1)
    variants += [
        StateVariant("checksum wrong", dumped(bad_checksum), usable=False),
        StateVariant("payload edited, checksum not updated", dumped(edited), usable=False),
        StateVariant(f"from a future version ({future['version']})", dumped(future), usable=False),
        StateVariant("not a state file", b'{"hello": "world"}\n', usable=False),
        StateVariant("binary garbage", bytes(range(256)) * 4, usable=False),
        StateVariant("empty", b"", usable=False),
        StateVariant("leftover temp file beside a good one", original, usable=True, temp=original[: len(original) // 2]),
    ]
    return variants


@dataclass
class StartOutcome:
    variant: str
    ready_s: float | None
    violations: list[str] = field(default_factory=list)


def start_on_state(node: Node, variant: StateVariant, settle_s: float) -> StartOutcome:
    """SIGKILL the controller, put ``variant`` in its state directory, start it, and check that
    it came up, handled the file as it should and adopted every live job."""
    controller = node.controller
    directory = controller.state_dir
    controller.kill()
    aside_before = set(directory.glob(STATE_FILE + ".corrupt-*"))
    (directory / STATE_FILE).write_bytes(variant.content)
    if variant.temp is not None:
        (directory / TEMP_FILE).write_bytes(variant.temp)
    log_before = len(controller.log())
    started = time.monotonic()
    try:
        controller.start(ready=True)
    except HarnessError as exc:
        return StartOutcome(variant.label, None, [f"the controller did not start: {exc}"])
    ready_s = time.monotonic() - started
    _, violations = node.wait_consistent(settle_s)
    status = controller.status()
    set_aside = set(directory.glob(STATE_FILE + ".corrupt-*")) - aside_before
    log = controller.log()[log_before:]
    expected_corruptions = 0 if variant.usable else 1
    if status.state_corruptions_total != expected_corruptions:
        violations.append(f"state_corruptions_total is {status.state_corruptions_total}, expected {expected_corruptions}")
    if len(set_aside) != expected_corruptions:
        violations.append(f"{len(set_aside)} file(s) moved aside, expected {expected_corruptions}")
    elif set_aside and next(iter(set_aside)).read_bytes() != variant.content:
        violations.append("the file moved aside is not the damaged file")
    if not variant.usable and "is unusable" not in log:
        violations.append("the log does not say the state file was unusable")
    if (directory / TEMP_FILE).exists():
        violations.append("the leftover temp file is still there")
    if controller.proc is None or controller.proc.poll() is not None:
        violations.append("the controller exited after starting")
    return StartOutcome(variant.label, ready_s, violations)


def fill(directory: Path) -> Path:
    """Fill the filesystem holding ``directory`` with a file of zeros until it is full; returns the file."""
    filler = directory / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as file:
        try:
            while True:
                file.write(chunk)
        except OSError:
            pass
        try:
            while True:
                file.write(b"\0")
        except OSError:
            pass
    return filler


@contextmanager
def small_tmpfs(mount_point: Path, size: str = "64k") -> Iterator[Path]:
    """A fresh tmpfs of ``size`` mounted on ``mount_point`` (root only), unmounted afterwards
    (lazily, in case a process still has a file open there)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def remount(mount_point: Path, mode: str) -> None:
    """Remount ``mount_point`` "ro" or "rw"."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount_point)], check=True)


def saved_state(node: Node, timeout: float = 30.0) -> bytes:
    """The state file's bytes once it names every job the controller lists (a registration
    is saved a moment after its launcher is moved into its group)."""
    directory = node.controller.state_dir

    def current() -> bytes | None:
        listed = {j.job_id for j in node.controller.status().jobs}
        return (directory / STATE_FILE).read_bytes() if saved_jobs(directory) == listed else None

    found = poll(current, timeout)
    if found is None:
        raise AssertionError(f"the state file never named the listed jobs: {saved_jobs(directory)}")
    return found


def saved_jobs(directory: Path) -> set[str] | None:
    """Job ids in ``directory``'s state file, None if it is missing or unreadable."""
    try:
        return set(json.loads((directory / STATE_FILE).read_bytes())["payload"]["jobs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_on_unwritable_state_dir(node: Node, damage: str, settle_s: float) -> list[str]:
    """With the controller's state directory on a small tmpfs (see small_tmpfs) and a job
    running: make the directory ``damage`` ("full" or "read-only"), then check that a new
    job is still managed, that a policy change (which only the state file would remember)
    is refused with a reason, that the old file is intact, that a crash and restart in
    that state adopts every job, and that once the damage is repaired the next save
    records everything. Returns what went wrong (empty: nothing)."""
    controller, directory = node.controller, node.controller.state_dir
    found: list[str] = []
    before = controller.status()
    saved_before = saved_jobs(directory)
    if saved_before != {j.job_id for j in before.jobs}:
        return [f"precondition: the state file names {saved_before}, the controller lists {before.jobs}"]
    log_start = len(controller.log())
    filler = fill(directory) if damage == "full" else None
    if damage == "read-only":
        remount(directory, "ro")
    node.expect_state_file = False
    try:
        arrival = node.start_job(name=f"arrival-while-{damage}")
        new_id = node.wait_registered(arrival)
        if new_id is None:
            found.append(f"a job arriving while the state directory is {damage} was not managed: "
                         f"{arrival.handle.output()[1][-400:]}")
        status = controller.status()
        if status.state_write_failures_total <= before.state_write_failures_total:
            found.append("state_write_failures_total did not count the failed save")
        if "cannot write the controller state" not in controller.log()[log_start:]:
            found.append("the log does not say the state could not be written")
        if saved_jobs(directory) != saved_before:
            found.append(f"the old state file changed or broke: it names {saved_jobs(directory)}")
        reply = controller.request(protocol.SetPolicy(policy="static"))
        if not (isinstance(reply, protocol.Error) and reply.code == "state_unwritable"):
            found.append(f"a policy change that cannot be saved was answered {reply}")
        if controller.status().policy != before.policy:
            found.append(f"the policy changed to {controller.status().policy} although it could not be saved")
        controller.kill()
        try:
            controller.start(ready=True)
        except HarnessError as exc:
            return found + [f"the controller did not restart on a {damage} state directory: {exc}"]
        _, left = node.wait_consistent(settle_s)
        found += left
    finally:
        if filler is not None:
            filler.unlink()
        if damage == "read-only":
            remount(directory, "rw")
        node.expect_state_file = True
    reply = controller.request(protocol.SetPolicy(policy=before.policy))  # any change saves
    if not isinstance(reply, protocol.Ok):
        found.append(f"after the repair, a save-triggering request was answered {reply}")
    _, left = node.wait_consistent(settle_s)
    return found + left
