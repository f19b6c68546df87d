"""How a job's DataLoaders become adloader's with no change to its code.

``adloader run`` puts :data:`BOOT_DIR` first on the job's ``PYTHONPATH``. Python imports the
``sitecustomize`` there at the start of every process of the job (torchrun's ranks, a
framework's own rank launcher, spawn and forkserver children: they all inherit the
environment). It chains to the environment's own ``sitecustomize`` and, in a managed job,
arranges that the moment ``torch`` finishes importing, ``torch.utils.data.DataLoader`` is
:class:`adloader.DataLoader` (substitute.py), using a post-import hook (hooks.py), so a
process that never imports torch pays nothing. This is how OpenTelemetry's
``opentelemetry-instrument`` and Datadog's ``ddtrace-run`` instrument programs.

Modules: hooks (run a function when a module has finished importing), substitute (put
adloader's loader in torch's place), boot/sitecustomize.py (the start-up file, alone in its
directory so that nothing else of ours lands on ``sys.path``). Nothing here imports torch.
"""
from __future__ import annotations

from pathlib import Path

BOOT_DIR = Path(__file__).resolve().parent / "boot"
"""The directory ``adloader run`` prepends to the job's ``PYTHONPATH``: it holds only ``sitecustomize.py``."""
