"""The package's public entry point: ``throughput_model.predict(features, gpus=..., device=...)``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import throughput_model
from throughput_model.predict import Prediction, features_for, predict

REPO = Path(__file__).resolve().parents[1]

_FRESH = """
import json, sys
import throughput_model
heavy = sorted(m for m in ("torch", "sklearn") if m in sys.modules)
result = throughput_model.predict(json.load(sys.stdin), gpus=2, device="H100")
print(json.dumps({"heavy_on_import": heavy, "prediction": result.to_dict()}))
"""


def test_the_package_itself_predicts_in_a_fresh_interpreter() -> None:
    """`import throughput_model; throughput_model.predict(...)` works before anything imported the
    module, costs no torch import until then, and answers what the module's function answers."""
    features, _ = features_for(zoo_name="mlp-w256-d2", batch=16)
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _FRESH], input=json.dumps(features), capture_output=True,
                          text=True, env=environ, timeout=120, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["heavy_on_import"] == []
    expected = predict(features, gpus=2, device="H100").to_dict()
    expected["notes"] = list(expected["notes"])
    assert answer["prediction"] == expected


def test_the_module_stays_importable_and_callable_in_process() -> None:
    features, _ = features_for(zoo_name="mlp-w256-d2", batch=16)
    import throughput_model.predict as module

    assert module is throughput_model.predict and module.Prediction is Prediction
    called = throughput_model.predict(features, gpus=1, device="cpu")
    assert isinstance(called, Prediction) and called == predict(features, gpus=1, device="cpu")
