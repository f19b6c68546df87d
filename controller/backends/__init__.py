"""Backends that enforce an allocation on the kernel; ``detect_backend`` picks the one this node supports."""
from controller.backends.affinity import AffinityBackend
from controller.backends.base import BackendError, ResourceBackend
from controller.backends.blockdev import read_device_of
from controller.backends.cgroup_v1 import CgroupV1Backend
from controller.backends.cgroup_v2 import CgroupV2Backend
from controller.backends.detect import BACKEND_NAMES, detect_backend

__all__ = [
    "AffinityBackend",
    "BACKEND_NAMES",
    "BackendError",
    "CgroupV1Backend",
    "CgroupV2Backend",
    "ResourceBackend",
    "detect_backend",
    "read_device_of",
]
