"""Run PyTorch's own test/test_dataloader.py twice: on torch's DataLoader, then on adloader's.

Its code is not ours and is not in this repository. Get the public file first, e.g. (network):
    curl -o /tmp/torch-tests/test_dataloader.py \\
      https://raw.githubusercontent.com/pytorch/pytorch/main/test/test_dataloader.py
(the run in docs/dataloader.md used the copy in the divyanshk/pytorch fork of main, commit
1c9475fbbc5d16b51e038fa14c1472fbfc7ffb6f). Then:
    python3 tests/torch_suite/run.py --file /tmp/torch-tests/test_dataloader.py [--parallel]
The file is copied into a temporary directory outside the repository and run with pytest, once as is
and once with ``sitecustomize.py`` (next to this script) substituting adloader.DataLoader for torch's in
every process. It prints both counts and the tests that pass on torch and fail on adloader; the
documented ones are listed, each with the test it explains, in docs/dataloader.md. Long (tens of
minutes on 2 cores): never part of the default suite. With pytest-timeout installed each test gets
``--test-timeout`` seconds.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | error | skipped, from pytest's JUnit XML."""
    results: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        results[name] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        results[name] = {"failure": "failed"}.get(results[name], results[name])
    return results


def run_once(copy: Path, substitute: bool, junit: Path, run_timeout: float, test_timeout: float) -> None:
    env = dict(os.environ)
    paths = [str(HERE)] if substitute else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["ADLOADER_SUBSTITUTE"] = "1" if substitute else "0"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
               f"--junitxml={junit}", "--rootdir", str(copy.parent), str(copy)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        command[4:4] = [f"--timeout={test_timeout}"]  # the plugin loads itself
    print("+", " ".join(command), f"(ADLOADER_SUBSTITUTE={env['ADLOADER_SUBSTITUTE']})", flush=True)
    try:
        subprocess.run(command, cwd=copy.parent, env=env, timeout=run_timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"run stopped after {run_timeout:.0f} s; counting what finished", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", required=True, type=Path, help="a local copy of PyTorch's test/test_dataloader.py")
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="seconds for each of the two runs")
    parser.add_argument("--test-timeout", type=float, default=300.0, help="seconds per test (pytest-timeout)")
    parser.add_argument("--json", type=Path, help="write the outcomes of both runs here")
    parser.add_argument("--parallel", action="store_true", help="run the torch and adloader runs at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torch-dataloader-suite-") as tmp:
        labels = {"torch": False, "adloader": True}
        for label in labels:  # one copy per run: both runs write next to the file (pycache, temp files)
            (Path(tmp) / label).mkdir()
            shutil.copy(args.file, Path(tmp) / label / "test_dataloader.py")
        runs_at_once = ThreadPoolExecutor(max_workers=2 if args.parallel else 1)
        with runs_at_once as pool:
            for label, substitute in labels.items():
                pool.submit(run_once, Path(tmp) / label / "test_dataloader.py", substitute,
                            Path(tmp) / f"{label}.xml", args.run_timeout, args.test_timeout)
        runs = {label: outcomes(Path(tmp) / f"{label}.xml") if (Path(tmp) / f"{label}.xml").exists() else {}
                for label in labels}
    for label, results in runs.items():
        counts = {k: sum(1 for v in results.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
        print(f"{label}: {counts}")
    regressions = sorted(t for t, v in runs["torch"].items() if v == "passed" and runs["adloader"].get(t) != "passed")
    print(f"pass on torch, not on adloader ({len(regressions)}):")
    for test in regressions:
        print(f"  {test}: {runs['adloader'].get(test, 'not run')}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "pass_on_torch_only": regressions}, indent=1))


if __name__ == "__main__":
    main()
