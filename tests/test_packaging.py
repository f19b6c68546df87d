"""The release artefacts work on their own: a wheel and an sdist built from the source tree
hold every package and data file, a wheel built from the sdist equals the direct one, and
``pip install dist/*.whl`` in a fresh venv gives an ``adloader`` whose ``demo --quick`` runs.

Nothing is downloaded: the venv sees this interpreter's installed packages (torch, numpy,
... and pip itself) through a path entry, not through its site hooks, so an editable
adloader installed here stays invisible and the wheel's copy is the only one; pip runs
with ``--no-index``.
"""
from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from bench.controller_process import REPO
from fixtures.managed import CGROUP_V1_USABLE, NO_CGROUP_V1

pytestmark = pytest.mark.slow

NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", ".pytest_cache",
                                    ".hypothesis", ".venv", "cache", "*.pyc")
DATA_FILES = ("throughput_model/data/corpus.json", "bench/mixes/adloader_like.json")


def _build(source: Path, out: Path, what: str) -> Path:
    """``build_wheel`` or ``build_sdist`` of setuptools' PEP 517 backend (no download, no isolation)."""
    result = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_{what}({str(out)!r}))"],
        cwd=source, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return out / result.stdout.strip().splitlines()[-1]


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if ".dist-info/" not in name}


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    top = tmp_path_factory.mktemp("dist")
    source = top / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    dist = top / "dist"
    return _build(source, dist, "sdist"), _build(source, dist, "wheel")


def test_the_sdist_and_the_wheel_hold_every_package_and_data_file(
    artefacts: tuple[Path, Path], tmp_path: Path,
) -> None:
    sdist, wheel = artefacts
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        # the "data" filter where this Python has it (3.11.4 and later; Debian 12's is 3.11.2)
        archive.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert {"pyproject.toml", "README.md", *DATA_FILES} <= names
    files = _wheel_files(wheel)
    for package in ("adloader", "controller", "launcher", "throughput_model", "bench"):
        assert f"{package}/__init__.py" in files
    assert set(DATA_FILES) <= files and not any(name.startswith("tests/") for name in files)
    rebuilt = _build(tmp_path / sdist.name.removesuffix(".tar.gz"), tmp_path / "dist", "wheel")
    assert _wheel_files(rebuilt) == files  # the sdist is complete


def test_the_wheel_in_a_fresh_venv_runs_the_quick_demo(artefacts: tuple[Path, Path], tmp_path: Path) -> None:
    if not CGROUP_V1_USABLE:
        pytest.skip(f"the demo runs a real controller: {NO_CGROUP_V1}")
    _, wheel = artefacts
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (purelib,) = (venv / "lib").glob("python*/site-packages")
    (purelib / "_this_interpreters_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    environ = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "--no-index", str(wheel)], capture_output=True,
                               text=True, timeout=300, cwd=tmp_path, env=environ)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Downloading" not in installed.stdout and "Successfully installed adloader" in installed.stdout
    assert not any(purelib.glob("torch*"))  # torch came from this interpreter's packages, never from an index
    where = subprocess.run([python, "-c", "import adloader, controller, launcher, bench, throughput_model as t; "
                            "print(adloader.__file__, controller.__file__, launcher.__file__, bench.__file__, "
                            "t.__file__)"], capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=60)
    assert all(path.startswith(str(purelib)) for path in where.stdout.split()), where

    demo = subprocess.run([str(venv / "bin" / "adloader"), "demo", "--quick", "--out", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=environ)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "running even ..." in demo.stdout and "running adaptive ..." in demo.stdout
    assert " cores " in demo.stdout and " gpu idle " in demo.stdout  # progress in adloader status's words
    # what it showed, in words: a sentence, the goals, the columns explained; no identifiers; one run said so
    assert re.search(r"^adaptive kept the GPUs \d+\.\d\dx as busy as even and (finished|took|finished in)",
                     demo.stdout, re.M), demo.stdout
    assert "ctl CPU: " in demo.stdout and "chg/job-min: " in demo.stdout and "(one run per policy)" in demo.stdout
    assert "goal adaptive_vs_even" not in demo.stdout and "medians over" not in demo.stdout
    assert (tmp_path / "demo" / "demo.json").exists()
    assert os.path.getsize(tmp_path / "demo" / "demo.json") > 0
