"""The public evaluation set is chosen by a fixed rule (the same list every time) and its
measure-and-predict run works end to end (a dry run on two architectures)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the public evaluation needs Hugging Face transformers, an optional "
                                           "dependency (install it with torch pinned, docs/prediction.md)")

from throughput_model import public_eval  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.pure


def test_the_rule_gives_the_same_candidates_in_the_same_order_twice() -> None:
    first, second = public_eval.candidates(), public_eval.candidates()
    assert first == second
    families = [f for f, _ in public_eval.FAMILIES]
    assert [c.family for c in first] == sorted((c.family for c in first), key=families.index)  # family by family
    types = [c.model_type for c in first]
    assert len(types) == len(set(types))  # a model type belongs to one family only
    assert len(first) >= 5 * public_eval.PER_FAMILY


def test_shrinking_caps_every_named_size_of_a_default_config() -> None:
    transformers = public_eval.transformers_module()
    llama = public_eval.shrink(transformers.AutoConfig.for_model("llama"))
    assert (llama.num_hidden_layers, llama.num_attention_heads, llama.hidden_size, llama.intermediate_size,
            llama.vocab_size, llama.head_dim) == (2, 4, 128, 256, 2048, 32)
    convnext = public_eval.shrink(transformers.AutoConfig.for_model("convnext"))
    assert convnext.hidden_sizes == [96, 128, 128, 128] and convnext.depths == [2, 2, 2, 2]
    assert convnext.image_size == public_eval.IMAGE_SIZE


@pytest.mark.slow
def test_a_dry_run_on_two_architectures_measures_and_predicts(tmp_path: Path) -> None:
    out = tmp_path / "public_eval.json"
    corpus = tmp_path / "host-corpus.json"  # as 'adloader model profile' would write it on this host
    shipped = json.loads((REPO / "throughput_model" / "data" / "corpus.json").read_text())
    corpus.write_text(json.dumps({**shipped, "cpu_model": "a host of its own"}))
    done = subprocess.run([sys.executable, "-m", "throughput_model.public_eval", "--out", str(out),
                           "--families", "vision,decoder", "--per-family", "1", "--steps", "2", "--warmup", "1",
                           "--corpus", str(corpus)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(out.read_text())
    assert document["corpus"]["path"] == str(corpus) and "a host of its own" in document["corpus"]["cpu_model"]
    rows = document["architectures"]
    assert [r["family"] for r in rows] == ["vision", "decoder"]
    order = [c.model_type for c in public_eval.candidates(("vision", "decoder"))]
    skipped = {s["model_type"] for s in document["skipped"]}
    for row in rows:  # the first candidate of its family that built and trained
        family_order = [t for t in order if t in {c.model_type for c in public_eval.candidates((row["family"],))}]
        assert set(family_order[:family_order.index(row["model_type"])]) <= skipped
        assert row["step_s"] > 0 and row["predicted_step_s"] > 0 and len(row["step_samples_s"]) == 2
        assert row["calibrations_apart"] >= 1
    # before each of the 2 timed steps and after the last: the calibrations span the steps' window
    assert len(document["calibrations"]) == 3 * len(rows)
    assert document["summary"]["n"] == 2 and "| **all** | 2 |" in done.stdout


def test_a_walk_past_the_set_gives_the_set_and_the_unseen_rest_apart() -> None:
    def row(family: str, error: float) -> dict:
        return {"family": family, "model_type": f"{family}{error}", "error": error, "in_interval": True}

    rows = [row("a", 0.1), row("b", -0.2), row("a", 0.3), row("a", -0.5), row("b", 0.05)]  # walk order
    apart = public_eval.by_rank(rows, set_size=2)
    assert apart["summary_the_set"]["n"] == 4 and apart["summary_the_set"]["worst_ape"] == 0.3
    assert apart["summary_beyond_the_set"]["n"] == 1 and apart["summary_beyond_the_set"]["worst_ape"] == 0.5
    document = {"summary": public_eval.summarise(rows), **apart, "architectures": rows, "skipped": []}
    assert "| beyond the set, never seen | 1 | 50.0% |" in public_eval.markdown(document)
    assert public_eval.by_rank(rows, set_size=3) == {}  # no family went past the set


def test_an_unreadable_corpus_is_one_plain_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "throughput_model.public_eval", "--out", str(tmp_path / "o.json"),
                           "--corpus", str(tmp_path / "missing.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "missing.json" in done.stderr and "adloader model profile" in done.stderr
    assert not (tmp_path / "o.json").exists()
