"""The controller's socket against a real controller: malformed input, the line bound, and
who may do what (SO_PEERCRED: pid for Report, uid for End and SetPolicy)."""
from __future__ import annotations

import json
import socket
import sys

from adloader import protocol
from adloader.client import ControllerClient
from bench.controller_process import ControllerProcess, wait_until
from fixtures.processes import run_forked_as_nobody

SLEEP = "import time; time.sleep(120)"

REPORTER = """
import json, os, sys
from adloader import protocol
from adloader.client import ControllerClient
client = ControllerClient(os.environ["ADLOADER_SOCKET"])
replies = {}
for label, job_id in (("own", os.environ["ADLOADER_JOB_ID"]), ("other", sys.argv[1])):
    reply = client.request_raw(protocol.encode(protocol.Report(job_id=job_id, samples=64, batches=2)))
    replies[label] = {"type": reply.TYPE, **{k: v for k, v in vars(reply).items()}}
print(json.dumps(replies), flush=True)
"""


def _raw_connection(controller: ControllerProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(controller.socket))
    return sock


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_malformed_lines_get_error_replies_on_a_connection_that_keeps_working(controller: ControllerProcess) -> None:
    garbage = {
        b"not json\n": "bad_json",
        b"\xff\xfe\n": "bad_encoding",
        b'{"v": 1, "type": "report", "job_id": 7}\n': "bad_field",
        b'{"v": 2, "type": "status"}\n': "unsupported_version",
        b'{"v": 1, "type": "target"}\n': "unknown_type",  # a reply type sent as a request
    }
    with controller.client() as client:
        for line, code in garbage.items():
            reply = client.request_raw(line)
            assert isinstance(reply, protocol.Error) and reply.code == code, (line, reply)
        assert isinstance(client.request(protocol.StatusRequest()), protocol.Status)
    errors = controller.status().errors_total
    assert all(errors.get(code, 0) >= 1 for code in garbage.values()), errors


def test_a_half_sent_line_on_one_connection_does_not_hold_up_another(controller: ControllerProcess) -> None:
    slow = _raw_connection(controller)
    try:
        slow.sendall(b'{"v": 1, "type": ')
        assert controller.status().connected_clients >= 1  # served while the other line is unfinished
        slow.sendall(b'"status"}\n')
        assert protocol.decode(_read_line(slow).rstrip(b"\n")).TYPE == "status_reply"
    finally:
        slow.close()


def test_a_line_over_the_bound_gets_too_long_and_its_connection_is_closed(controller: ControllerProcess) -> None:
    sock = _raw_connection(controller)
    try:
        try:
            sock.sendall(b"x" * (protocol.MAX_LINE_BYTES + 4096))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the controller may close before we finish writing; its reply is already queued
        reply = protocol.decode(_read_line(sock).rstrip(b"\n"))
        assert isinstance(reply, protocol.Error) and reply.code == "too_long"
        assert wait_until(lambda: sock.recv(65536) == b"", 10, "the connection to close")
    finally:
        sock.close()
    assert controller.status().errors_total.get("too_long") == 1


def test_reports_only_for_the_job_whose_cgroup_holds_the_sender(controller: ControllerProcess) -> None:
    victim = controller.run(sys.executable, "-c", SLEEP, name="victim")
    victim_id = controller.registered(victim).job_id
    # From a process in no job's group (this test), naming the victim's id:
    reply = controller.request(protocol.Report(job_id=victim_id, samples=1))
    assert isinstance(reply, protocol.Error) and reply.code == "forbidden", reply
    reply = controller.request(protocol.Report(job_id="j-nonexistent"))
    assert isinstance(reply, protocol.Error) and reply.code == "unknown_job", reply
    # From inside another job: its own id is answered with its target, the victim's is refused.
    reporter = controller.run(sys.executable, "-c", REPORTER, victim_id, name="reporter")
    assert reporter.wait() == 0, reporter.output()
    replies = json.loads(reporter.output()[0])
    assert replies["own"] == {"type": "target", "num_workers": 1,  # Target.cores is gone: no job read it
                              "reason": "the even policy gives this job 0.5 cores (a CPU quota), and workers follow "
                              "cores"}, replies
    assert replies["other"]["type"] == "error" and replies["other"]["code"] == "forbidden", replies
    assert controller.job(victim_id).samples_total == 0  # the victim's counters never moved


def test_status_is_anyones_but_policy_is_roots_and_end_the_owners(controller: ControllerProcess) -> None:
    job = controller.run(sys.executable, "-c", SLEEP, name="roots-job")
    job_id = controller.registered(job).job_id
    path = str(controller.socket)

    def as_nobody() -> dict[str, list[str | None]]:
        with ControllerClient(path) as client:
            replies = {
                "status": client.request_raw(protocol.encode(protocol.StatusRequest())),
                "policy": client.request_raw(protocol.encode(protocol.SetPolicy(policy="static"))),
                "end": client.request_raw(protocol.encode(protocol.End(job_id=job_id, exit_code=0))),
            }
        return {k: [r.TYPE, getattr(r, "code", None)] for k, r in replies.items()}

    assert run_forked_as_nobody(as_nobody) == {
        "status": ["status_reply", None], "policy": ["error", "forbidden"], "end": ["error", "forbidden"],
    }
    assert controller.status().policy == "even" and controller.job(job_id).state != "gone"

    bad = controller.request(protocol.SetPolicy(policy="fastest"))
    assert isinstance(bad, protocol.Error) and bad.code == "bad_policy" and "even" in bad.message
    assert isinstance(controller.request(protocol.SetPolicy(policy="static")), protocol.Ok)
    wait_until(lambda: controller.job(job_id).cores is None, 5, "the static policy to lift the quota")
    assert controller.status().reallocations_total.get("policy_change") == 1
    assert "policy changed from even to static" in controller.log()
