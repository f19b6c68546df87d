"""The label values the status snapshot can carry, known in advance.

The snapshots themselves (:class:`~adloader.protocol.NodeSnapshot`,
:class:`~adloader.protocol.JobSnapshot`) are protocol messages, so ``adloader status``
reads them without importing the controller; :mod:`controller.projections` builds them.
"""
from __future__ import annotations

from adloader.protocol import JobSnapshot, NodeSnapshot

__all__ = ["ERROR_KINDS", "JOB_STATES", "REALLOCATION_REASONS", "JobSnapshot", "NodeSnapshot"]

JOB_STATES: tuple[str, ...] = ("starting", "running", "unmanaged", "gone")
REALLOCATION_REASONS: tuple[str, ...] = ("arrival", "departure", "gain", "policy_change", "adoption", "safety_net",
                                            "workers_pinned")
ERROR_KINDS: tuple[str, ...] = (
    "too_long", "bad_encoding", "bad_json", "not_object", "bad_version", "unsupported_version",
    "unknown_type", "unknown_field", "missing_field", "bad_number", "bad_field", "internal",
    "already_registered", "backend_failed", "forbidden", "bad_policy", "unknown_job", "state_unwritable",
    "bad_workers", "not_managed",
)
"""Known values of ``JobSnapshot.state``, of the keys of ``reallocations_total`` and of
``errors_total`` (the protocol's error codes plus the controller's). The exporter shows
every one from the start, at 0; a key not listed here still appears once counted."""
