"""The corpus file and the CPU it belongs to, without torch or scikit-learn.

`adloader doctor` and the controller's choice of corpus (controller/node_memory.py) read which
CPU a corpus was profiled on and which CPU this host has; both must work where torch is broken
or absent (the doctor probes torch only in a subprocess). Fitting lives in :mod:`fit`.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from throughput_model.errors import CorpusError

MAKE_CORPUS = "make one with 'adloader model profile --out FILE'"
MIN_POINTS = 3
"""The fewest points a corpus is fitted on; :mod:`fit` fits one operator class on no fewer."""


def load_corpus(path: Path | None = None) -> dict:
    """The corpus at ``path``, or the one shipped in ``throughput_model/data/corpus.json``."""
    try:
        if path is None:
            text = resources.files("throughput_model").joinpath("data/corpus.json").read_text()
        else:
            text = Path(path).read_text()
        corpus = json.loads(text)
    except (OSError, ValueError) as exc:
        where = path or "the shipped throughput_model/data/corpus.json"
        raise CorpusError(f"cannot read the corpus {where}: {exc}; {MAKE_CORPUS}") from None
    if not isinstance(corpus, dict) or not corpus.get("points"):
        raise CorpusError(f"corpus {path or 'shipped'} has no points; re-run 'adloader model profile'")
    if len(corpus["points"]) < MIN_POINTS:  # refused here, where the controller chooses its corpus, not at first fit
        raise CorpusError(f"corpus {path or 'shipped'} has {len(corpus['points'])} point(s), too few to fit (need "
                          f"{MIN_POINTS}); re-run 'adloader model profile' without --families or --quick")
    return corpus


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This host's CPU as ``/proc/cpuinfo`` names it (what a corpus records as ``cpu_model``)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown cpu"
