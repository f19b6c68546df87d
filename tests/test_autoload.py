"""``adloader run`` makes the job's torch DataLoaders adloader's with no code change (adloader/autoload):
real Python processes started with the environment the launcher gives a managed job, and one unchanged
plain-torch script under ``adloader run`` against a real controller.

Checked: the start-up file chains to the environment's own ``sitecustomize`` (once, also with our
directory twice on the path) and imports no torch in a process that does not; after ``import torch``
both of torch's names are adloader's class, a subclass defined later inherits it, a spawn child is
substituted too; ``--no-substitute`` (``ADLOADER_SUBSTITUTE=0``) and an unmanaged process keep torch's;
a loader adloader cannot run falls back to torch's iteration with one warning per process and its
reason recorded, as does a subclass that never calls our ``__init__`` (torchdata's StatefulDataLoader);
``adloader.DataLoader`` is a real class once torch is imported, so Lightning's re-instantiation of a
loader built inside its patching works (it raised "got multiple values for argument 'sampler'").
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from adloader import env
from adloader.autoload import BOOT_DIR, hooks
from bench.controller_process import REPO, ControllerProcess, base_environment, wait_until

OURS = "adloader.dataloader.loader.DataLoader"


def managed_environment(substitute: bool = True, **extra: str) -> dict[str, str]:
    """What ``adloader run`` gives a managed job's command (no controller listens on the socket)."""
    environ = env.managed_environment(base_environment(), "/tmp/adl-autoload-none.sock", "job-1", substitute=substitute)
    environ.update(extra)
    return environ


def run_python(script: str, environ: dict[str, str], tmp_path: Path) -> dict:
    """Run ``script`` as a file in a fresh interpreter; the JSON object it prints last."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    result = subprocess.run([sys.executable, str(path)], env=environ, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"stderr": result.stderr}


def test_start_up_chains_to_the_environments_sitecustomize_once_and_imports_no_torch(tmp_path: Path) -> None:
    own = tmp_path / "site-own"
    own.mkdir()
    (own / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.OWN_SITE_RUNS = getattr(builtins, 'OWN_SITE_RUNS', 0) + 1\n")
    environ = managed_environment()
    environ["PYTHONPATH"] = f"{BOOT_DIR}:{environ['PYTHONPATH']}:{own}"  # ours twice: no recursion
    seen = run_python("""
        import builtins, json, sys
        print(json.dumps({"own_runs": getattr(builtins, "OWN_SITE_RUNS", 0),
                          "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")
                                          or m.startswith("adloader.dataloader"))}))
    """, environ, tmp_path)
    assert seen["own_runs"] == 1
    assert seen["heavy"] == []


def test_a_hook_runs_once_when_its_module_has_imported_and_one_that_fails_breaks_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"adl_hook_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[int] = []

    def fail(_module: object) -> None:
        raise RuntimeError("a broken hook")

    hooks.when_imported(name, fail)
    hooks.when_imported(name, lambda module: calls.append(module.VALUE))
    module = importlib.import_module(name)
    importlib.import_module(name)
    assert calls == [42]
    assert type(module.__loader__) is SourceFileLoader and module.__spec__.loader is module.__loader__
    hooks.when_imported(name, lambda module: calls.append(-module.VALUE))  # imported already: at once
    assert calls == [42, -42]
    monkeypatch.delitem(sys.modules, name)


SUBSTITUTED = """
    import json, multiprocessing, sys, warnings
    assert "torch" not in sys.modules
    import torch
    import torch.utils.data.dataloader
    from torch.utils.data import DataLoader, TensorDataset
    import adloader

    def name(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    def class_in_child(queue):
        import torch.utils.data
        queue.put(name(torch.utils.data.DataLoader))

    class Later(DataLoader):
        pass

    if __name__ == "__main__":
        data = TensorDataset(torch.arange(32.0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = [b[0].tolist() for b in Later(data, batch_size=4, num_workers=1)]
            fallbacks = [DataLoader(data, batch_size=4, num_workers=1, in_order=False) for _ in range(2)]
            fallback_batches = [b[0].tolist() for b in fallbacks[0]]
        from torchdata.stateful_dataloader import StatefulDataLoader
        stateful = StatefulDataLoader(data, batch_size=4, num_workers=1)
        stateful_batches = [b[0].tolist() for b in stateful]
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=class_in_child, args=(queue,))
        child.start()
        child_class = queue.get(timeout=60)
        child.join()
        from adloader import unmanaged
        print(json.dumps({
            "names": [name(torch.utils.data.DataLoader), name(torch.utils.data.dataloader.DataLoader)],
            "same_as_adloader": torch.utils.data.DataLoader is adloader.DataLoader,
            "later_is_ours": issubclass(Later, adloader.DataLoader), "batches": batches,
            "warnings": [(w.category.__name__, str(w.message)) for w in caught if "adloader" in str(w.message)],
            "fallback_classes": [name(type(it)) for it in (iter(f) for f in fallbacks)],
            "fallback_reasons": [f.unmanaged_reason for f in fallbacks], "fallback_batches": fallback_batches,
            "stateful": [name(StatefulDataLoader.__mro__[1]), stateful.unmanaged_reason, stateful_batches],
            "recorded": list(unmanaged.unmanaged_reasons()), "child_class": child_class,
        }))
"""


@pytest.fixture(scope="module")
def substituted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What one managed process with the substitution saw (one interpreter for the tests below)."""
    return run_python(SUBSTITUTED, managed_environment(), tmp_path_factory.mktemp("substituted"))


def test_torch_loaders_become_ours_in_a_managed_process_and_its_spawn_children(substituted: dict) -> None:
    seen = substituted
    assert seen["names"] == [OURS, OURS]
    assert seen["same_as_adloader"] and seen["later_is_ours"]
    assert seen["batches"] == [[4.0 * i + k for k in range(4)] for i in range(8)]
    assert seen["child_class"] == OURS


def test_a_loader_adloader_cannot_run_falls_back_to_torchs_with_one_warning(substituted: dict) -> None:
    seen = substituted
    [(category, message)] = seen["warnings"]  # two loaders, one warning in the process
    assert category == "TorchLoaderFallback" and "in_order=False" in message
    assert seen["fallback_classes"] == ["torch.utils.data.dataloader._MultiProcessingDataLoaderIter"] * 2
    assert all("in_order=False" in reason for reason in seen["fallback_reasons"])
    assert sorted(x for batch in seen["fallback_batches"] for x in batch) == [float(i) for i in range(32)]
    # torchdata's loader subclasses ours here but never calls our __init__: it runs as itself, unmanaged
    parent, reason, stateful_batches = seen["stateful"]
    assert parent == OURS and "StatefulDataLoader does not call DataLoader.__init__" in reason
    assert stateful_batches == seen["batches"]
    in_order, stateful = seen["recorded"]
    assert "in_order=False" in in_order and "StatefulDataLoader" in stateful


def test_loaders_stay_torchs_with_adloader_run_no_substitute(tmp_path: Path) -> None:
    seen = run_python("""
        import json, torch.utils.data
        DataLoader = torch.utils.data.DataLoader
        print(json.dumps({"name": f"{DataLoader.__module__}.{DataLoader.__qualname__}"}))
    """, managed_environment(substitute=False), tmp_path)
    assert seen["name"] == "torch.utils.data.dataloader.DataLoader"


@pytest.mark.slow  # importing Lightning alone takes ~7 s of CPU
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
def test_adloader_dataloader_is_a_class_once_torch_imports_so_lightning_can_rebuild_it(tmp_path: Path) -> None:
    seen = run_python("""
        import json
        import adloader                      # before torch: the class is defined when torch has imported
        import torch
        from lightning.fabric.utilities.data import _replace_dunder_methods, _update_dataloader
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        defined_with_torch = "DataLoader" in vars(adloader)
        data = TensorDataset(torch.arange(16.0))
        with _replace_dunder_methods(DataLoader, "dataset"):  # as Lightning's train_dataloader hook runs
            loader = adloader.DataLoader(data, batch_size=2, shuffle=True)
        rebuilt = _update_dataloader(loader, DistributedSampler(data, num_replicas=2, rank=0, shuffle=False))
        print(json.dumps({"defined_with_torch": defined_with_torch, "rebuilt": type(rebuilt) is adloader.DataLoader,
                          "batches": [b[0].tolist() for b in rebuilt]}))
    """, base_environment(), tmp_path)
    assert seen["defined_with_torch"] and seen["rebuilt"]
    assert seen["batches"] == [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0], [12.0, 14.0]]


def test_naming_adloader_dataloader_before_torch_imports_it_quietly(tmp_path: Path) -> None:
    """The one-line change in a script that imports torch only through it: torch imports while
    ``adloader.dataloader`` does, and the post-import hook must leave the class to that import (it
    printed a circular-import traceback)."""
    seen = run_python("""
        import json
        from adloader import DataLoader
        print(json.dumps({"batches": [b.tolist() for b in DataLoader(list(range(4)), batch_size=2)]}))
    """, base_environment(), tmp_path)
    assert seen["batches"] == [[0, 1], [2, 3]]
    assert seen["stderr"] == ""


def test_outside_a_managed_job_import_adloader_stays_light_and_torch_keeps_its_loader(tmp_path: Path) -> None:
    """``adloader --help`` and the controller import adloader: no torch. Torch imported after it defines
    ``adloader.DataLoader`` at once, and without a job id the start-up file substitutes nothing."""
    seen = run_python("""
        import json, sys
        import adloader
        light = "torch" not in sys.modules and "DataLoader" not in vars(adloader)
        import torch.utils.data
        DataLoader = torch.utils.data.DataLoader
        print(json.dumps({"light": light, "defined": "DataLoader" in vars(adloader),
                          "name": f"{DataLoader.__module__}.{DataLoader.__qualname__}"}))
    """, base_environment(PYTHONPATH=f"{BOOT_DIR}:{REPO}", ADLOADER_SUBSTITUTE="1"), tmp_path)
    assert seen["light"] and seen["defined"]
    assert seen["name"] == "torch.utils.data.dataloader.DataLoader"


@pytest.mark.slow
def test_an_unchanged_torch_script_under_adloader_run_reports_and_follows_the_target(
        controller: ControllerProcess, tmp_path: Path) -> None:
    out, stop = tmp_path / "rank0.json", tmp_path / "stop"
    job = controller.run(sys.executable, str(REPO / "tests" / "plain_torch_job.py"), "--out", str(out),
                         "--stop-file", str(stop), name="plain-torch")
    job_id = controller.registered(job).job_id
    snap = wait_until(lambda: (s := controller.job(job_id)) and s.ranks_reporting == 1 and s.samples_total > 0
                      and s.workers_target and s, 60.0, f"the plain torch job to report; log:\n{controller.log()}")
    wait_until(lambda: (s := controller.job(job_id)) and s.samples_total > snap.samples_total, 60.0,
               "more samples after the target was set")
    # Described at its first optimizer step (it never calls describe_model): the controller predicts its M.
    wait_until(lambda: (s := controller.job(job_id)) and s.max_sps_predicted, 30.0,
               f"a prediction from the job's own model; log:\n{controller.log()}")
    stop.touch()
    assert job.wait(60) == 0, job.output()
    record = json.loads(out.read_text())
    assert record["loader_class"] == OURS and record["samples"] > 0
    assert snap.workers_target in record["workers_seen"], (snap.workers_target, record)
    assert controller.job(job_id) is None or controller.job(job_id).state != "unmanaged"
