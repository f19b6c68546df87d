"""Wire protocol: round trips and the error codes malformed lines get."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from adloader import protocol
from adloader.errors import ProtocolError


def test_every_message_type_round_trips() -> None:
    samples = [
        protocol.Register(name="resnet", gpus=2, num_workers=4, features={"flops": 1e9}),
        protocol.Report(job_id="j1", rank=1, world_size=2, samples=64, data_wait_s=0.5),
        protocol.End(job_id="j1", exit_code=3),
        protocol.StatusRequest(),
        protocol.SetPolicy(policy="even"),
        protocol.SetWorkers(job_id="j1", num_workers=6),
        protocol.SetWorkers(job_id="j1", num_workers=None),
        protocol.Registered(job_id="j1", cgroup="/sys/fs/cgroup/cpu/adloader/j1", backend="cgroup-v1"),
        protocol.Target(num_workers=3),
        protocol.Status(node=protocol.NodeSnapshot(
            version="0", policy="even", backend="cgroup-v1", started_at=0.0, period_s=1.0, cpus=(0,), read_bps=None,
            read_device=None, jobs=(protocol.JobSnapshot(job_id="j1", name="x", uid=0, gpus=1, state="running",
                                                         launcher_pid=1, pids=(1,), cgroup="g", registered_at=0.0),),
        )),
        protocol.Ok(),
        protocol.Error(code="bad_json", message="x"),
    ]
    assert {type(m) for m in samples} == set(protocol.MESSAGE_TYPES.values())
    for message in samples:
        assert protocol.decode(protocol.encode(message)) == message


@pytest.mark.parametrize(
    "line, code",
    [
        (b"\xff\xfe", "bad_encoding"),
        (b"not json", "bad_json"),
        (b"[1, 2]", "not_object"),
        (b'{"type": "status"}', "bad_version"),
        (b'{"v": 99, "type": "status"}', "unsupported_version"),
        (b'{"v": 1, "type": "launch_missiles"}', "unknown_type"),
        (b'{"v": 1, "type": "report"}', "missing_field"),
        (b'{"v": 1, "type": "report", "job_id": 7}', "bad_field"),
        (b'{"v": 1, "type": "set_workers", "job_id": "j1"}', "missing_field"),  # auto is an explicit null
        (b'{"v": 1, "type": "set_workers", "job_id": "j1", "num_workers": 0}', "bad_number"),
        (b'{"v": 1, "type": "report", "job_id": "a", "samples": NaN}', "bad_number"),
        (b'{"v": 1, "type": "report", "job_id": "a", "samples": -5}', "bad_number"),
        (b'{"v": 1, "type": "report", "job_id": "a", "data_wait_s": 1e400}', "bad_number"),
        (b'{"v": 1, "type": "report", "job_id": "a", "colour": "red"}', "unknown_field"),
        (b'{"v": 1, "type": "register", "name": "a\\u0000b"}', "bad_field"),
        (b"[" * 200_000, "too_long"),
        (b"[" * 100_000, "bad_json"),
    ],
)
def test_malformed_lines_get_a_specific_code(line: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        protocol.decode(line)
    assert info.value.code == code


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_any_json_value_decodes_or_raises_protocol_error(value: object) -> None:
    try:
        line = json.dumps({"v": 1, "type": "report", "job_id": "a", "features": value})
    except ValueError:
        return
    try:
        message = protocol.decode(line.encode())
    except ProtocolError as exc:
        assert exc.code in {"bad_field", "bad_number", "bad_json"}
    else:
        assert isinstance(message, protocol.Report)
