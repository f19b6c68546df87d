"""``adloader model`` in a real subprocess: predict, fit, evaluate, a small profile."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from throughput_model.corpus import load_corpus
from throughput_model.counting import OP_CLASSES
from throughput_model.errors import CorpusError
from throughput_model.zoo import ZOO

ROOT = Path(__file__).resolve().parents[1]


def _model(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "adloader", "--log-level", "WARNING", "model", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def test_predict_a_zoo_model_on_cpu_and_on_a_gpu_prior() -> None:
    cpu = json.loads(_model("predict", "--zoo", "resnet-basic-w16-1x1x1-g1-i32", "--batch", "16", "--device", "cpu:1",
                            "--json").stdout)
    assert cpu["model"].startswith("resnet-basic-w16") and cpu["calibrated"] is True
    assert cpu["low"] < cpu["samples_per_s"] < cpu["high"]
    gpu = json.loads(_model("predict", "--zoo", "resnet-basic-w16-1x1x1-g1-i32", "--batch", "16", "--device", "A100",
                            "--gpus", "4", "--json").stdout)
    assert gpu["calibrated"] is False and gpu["gpus"] == 4 and gpu["allreduce_seconds"] > 0
    assert "prior only" in gpu["basis"]


def test_predict_a_model_file(tmp_path: Path) -> None:
    model_file = tmp_path / "tiny_cnn.py"
    model_file.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build():\n"
        "    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))\n"
        "    model(torch.randn(1, 3, 16, 16))  # materialise the lazy layer\n"
        "    return model, torch.randn(32, 3, 16, 16), None, 'sgd'\n"
    )
    out = _model("predict", "--model-file", str(model_file)).stdout
    assert out.startswith("tiny_cnn.py (Sequential, batch 32): ") and "samples/s" in out and "CPU-proxy" in out


def test_predict_says_what_is_wrong() -> None:
    proc = _model("predict", "--zoo", "no-such-net", check=False)
    assert proc.returncode == 2 and "no zoo model named 'no-such-net'" in proc.stderr
    proc = _model("predict", "--zoo", "mlp-w256-d2", "--device", "TPU", check=False)
    assert proc.returncode == 2 and "no device 'TPU'" in proc.stderr
    listing = _model("predict", "--list").stdout.splitlines()
    assert len(listing) == len(ZOO) and listing[0].startswith("mlp-")


def test_fit_shows_every_class_coefficient() -> None:
    out = _model("fit").stdout
    for cls in OP_CLASSES:
        assert f"\n{cls} " in out
    assert "fitted from" in out and "interval" in out


@pytest.mark.slow
def test_profile_quick_subset_then_evaluate_it(tmp_path: Path) -> None:
    corpus_file = tmp_path / "corpus.json"
    out = _model("profile", "--quick", "--families", "mlp", "rnn", "--steps", "3", "--out", str(corpus_file)).stdout
    assert f"wrote 8 points to {corpus_file}" in out
    corpus = json.loads(corpus_file.read_text())
    assert {p["family"] for p in corpus["points"]} == {"mlp", "rnn"}
    assert corpus["threads"] == 1 and corpus["device_numbers"]["peak_flops"] > 0
    results = tmp_path / "eval.json"
    table = _model("evaluate", "--corpus", str(corpus_file), "--json", str(results)).stdout
    assert "CPU-proxy" in table and "| rnn |" in table
    assert json.loads(results.read_text())["points"] == 8


def test_a_bad_corpus_is_reported(tmp_path: Path) -> None:
    corpus_file = tmp_path / "bad.json"
    corpus_file.write_text("not json at all")
    proc = _model("fit", "--corpus", str(corpus_file), check=False)
    assert proc.returncode == 2 and "adloader model profile" in proc.stderr
    corpus_file.write_text('{"points": []}')
    with pytest.raises(CorpusError, match="no points"):
        load_corpus(corpus_file)
