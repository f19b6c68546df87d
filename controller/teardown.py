"""Uninstall's last step: lift every limit and remove every group a controller left.

A stopped controller lifts its jobs' limits but keeps their groups, so the next one can
adopt them. Removing adloader from a node must leave nothing: every job group's limits
are lifted, its processes moved out (they keep running, unmanaged), the group removed,
then the group they lived under. Refused while a controller holds the group.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from controller.backends.base import ResourceBackend
from controller.ownership import Holder, Ownership

log = logging.getLogger(__name__)


def remove_every_group(backend: ResourceBackend, ownership: Ownership, holder: Holder) -> list[str]:
    """Lift the limits of and remove every job group, then the group itself; the job ids removed.
    Raises OwnershipError while a controller manages the group, BackendError if the kernel refuses."""
    ownership.acquire(holder)
    try:
        removed = []
        for job_id in backend.existing_jobs():
            backend.release(job_id)
            backend.remove(job_id)
            removed.append(job_id)
            log.info("job group %s: limits lifted, processes moved out, group removed", job_id)
        backend.remove_group()
        return removed
    finally:
        ownership.release()


def teardown_holder(socket: Path, state_dir: Path, group: str) -> Holder:
    """Who holds the locks while the groups are removed (a second controller's refusal names it)."""
    return Holder(pid=os.getpid(), socket=f"none (removing the groups of {socket})", state_dir=str(state_dir),
                  group=group)
