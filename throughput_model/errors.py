"""Typed errors of the throughput model.

They do not subclass ``adloader.errors.AdloaderError`` on purpose: ``throughput_model``
imports no other package of ours (DESIGN.md's dependency rule). Callers in ``adloader``
and ``controller`` catch :class:`ThroughputModelError`.
"""
from __future__ import annotations


class ThroughputModelError(Exception):
    """Base class of every error the throughput model raises on purpose."""


class UnknownModel(ThroughputModelError):
    """A zoo model name or model file that cannot be found or built."""


class UnknownDevice(ThroughputModelError):
    """A device name that is not in the device table."""


class CorpusError(ThroughputModelError):
    """The corpus is missing, malformed, or too small to fit."""
