"""Profiling, fitting, held-out evaluation, prediction and online correction, on real measurements."""
from __future__ import annotations

import json
import math
import statistics
from importlib import resources

import pytest

from throughput_model import evaluate, fit, online, predict, profile
from throughput_model.corpus import load_corpus
from throughput_model.counting import OP_CLASSES, class_of_timed_key
from throughput_model.errors import UnknownDevice
from throughput_model.zoo import FAMILIES, zoo_model


@pytest.fixture(scope="module")
def corpus() -> dict:
    return load_corpus()


def _subset(corpus: dict, families: tuple[str, ...], models_per_family: int = 3) -> dict:
    kept, seen = [], {}
    for point in corpus["points"]:
        if point["family"] not in families:
            continue
        names = seen.setdefault(point["family"], [])
        if point["model"] not in names:
            if len(names) == models_per_family:
                continue
            names.append(point["model"])
        kept.append(point)
    return {**corpus, "points": kept}


def test_profiling_measures_a_real_training_step() -> None:
    record = profile.profile_point(zoo_model("mlp-w256-d2"), 16, steps=4, warmup=1, instrumented=1)
    assert record["family"] == "mlp" and record["batch"] == 16
    assert len(record["step_samples_s"]) == 4 and all(t > 0 for t in record["step_samples_s"])
    assert record["step_s"] == pytest.approx(statistics.median(record["step_samples_s"]), rel=1e-3)
    by_class: dict[str, float] = {}
    for key, seconds in record["op_s"].items():
        cls = class_of_timed_key(key)
        assert cls in OP_CLASSES and key.split("/")[0] in ("forward", "backward", "optimizer")
        by_class[cls] = by_class.get(cls, 0.0) + seconds
    assert by_class["gemm"] > 0 and by_class["optimizer"] > 0
    assert "conv" not in by_class  # an MLP has no convolution, and none was timed
    assert "backward/gemm/mm" in record["op_s"] and "forward/gemm/addmm" in record["op_s"]
    assert record["features"]["count_complete"] == 1.0


def test_split_half_noise_compares_the_medians_of_a_points_two_halves() -> None:
    assert evaluate.split_half_noise([1.0, 1.2, 1.0, 2.0, 2.0, 2.2]) == pytest.approx(0.5)
    assert evaluate.split_half_noise([1.0, 1.0, 1.0]) is None


def test_a_profile_calibrates_the_device_at_each_family_boundary() -> None:
    points = [(zoo_model("mlp-w256-d2"), 16), (zoo_model("recsys-bag-r20000-d32-t4-b32-w256-l3-sparse"), 16)]
    corpus = profile.profile(points, steps=2)
    assert [p["family"] for p in corpus["points"]] == ["mlp", "recsys"]
    assert len(corpus["calibrations"]) == 3  # before, between the two families, after
    flops = sorted(c["numbers"]["peak_flops"] for c in corpus["calibrations"])
    assert corpus["device_numbers"]["peak_flops"] == flops[1]  # the median, not the mean of the ends
    assert corpus["points"][1]["features"]["embedding_ops"] > 0


def test_the_shipped_corpus_is_json_data_covering_every_family(corpus: dict) -> None:
    text = resources.files("throughput_model").joinpath("data/corpus.json").read_text()
    assert json.loads(text)["points"]  # plain JSON: no pickle anywhere
    assert set(p["family"] for p in corpus["points"]) == set(FAMILIES)
    assert corpus["threads"] == 1
    assert all(p["step_s"] > 0 and len(p["step_samples_s"]) >= 25 for p in corpus["points"])


def test_the_fitted_model_is_rebuilt_from_the_corpus_and_cached() -> None:
    first = fit.load_fitted()
    assert fit.load_fitted() is first
    assert set(first.coefficients) == set(OP_CLASSES)
    assert all(v >= 0 for coefficients in first.coefficients.values() for v in coefficients)
    assert all(first.sources[c].startswith("fitted") for c in OP_CLASSES)  # every class shows in the corpus
    low, high = first.log_interval
    assert low < 0 < high


def test_a_class_no_training_family_shows_is_borrowed(corpus: dict) -> None:
    points = [p for p in fit.points_of(corpus) if p["family"] not in ("rnn", "audio", "recsys")]  # every GRU and RNN
    model = fit.fit(points, fit.corpus_device(corpus), with_interval=False)
    assert model.sources["rnn"].startswith("borrowed")
    assert model.coefficients["rnn"][0] == model.coefficients["gemm"][0]


def test_column_buffers_no_training_family_shows_cost_what_a_copy_does(corpus: dict) -> None:
    """Only the audio family's wide depthwise convolutions run GEMM-lowered: with audio in training
    the depthwise class fits its own column-buffer coefficient, with audio held out it takes the
    coefficient of a plain copy's bytes (movement's roofline) rather than nothing."""
    device = fit.corpus_device(corpus)
    lowered = fit.TERMS.index("lowered")
    seen = fit.fit(fit.points_of(corpus), device, with_interval=False)
    unseen = fit.fit([p for p in fit.points_of(corpus) if p["family"] != "audio"], device, with_interval=False)
    assert "borrowed" not in seen.sources["conv_depthwise"] and seen.coefficients["conv_depthwise"][lowered] > 0
    assert unseen.coefficients["conv_depthwise"][lowered] == unseen.coefficients["movement"][0] > 0
    assert "lowered from movement" in unseen.sources["conv_depthwise"]


def test_fit_and_evaluate_end_to_end_on_a_subset(corpus: dict) -> None:
    small = _subset(corpus, ("mlp", "encoder", "vit"))
    result = evaluate.evaluate(small)
    assert result["label"] == "CPU-proxy"
    assert set(result["per_family"]) == {"mlp", "encoder", "vit"}
    pooled = result["pooled"]
    assert pooled["model"]["n"] == len(small["points"])
    for method in ("model", "prior", "roofline", "ernest"):
        summary = pooled[method]
        assert math.isfinite(summary["mean_ape"]) and summary["p90_ape"] >= 0
        assert -1 <= summary["spearman"] <= 1
    assert pooled["online"]["n"] == len(small["points"])
    assert pooled["noise_floor"]["n"] == len(small["points"]) and pooled["noise_floor"]["mean_ape"] >= 0
    assert set(result["goals_met"]) == set(evaluate.GOALS)
    table = evaluate.markdown(result)
    assert "CPU-proxy" in table and "| mlp |" in table and "Goals" in table


def test_ernest_predicts_a_batch_size_from_the_others() -> None:
    points = [{"model": "m", "batch": b, "step_s": 0.002 + 0.001 * b} for b in (1, 4, 16)]
    assert evaluate.ernest_predictions(points) == pytest.approx([0.003, 0.006, 0.018])


def test_cpu_prediction_has_an_interval_and_the_gpu_prior_says_what_it_is() -> None:
    features, _ = predict.features_for(zoo_name="vit-i32-p4-d128-l2-h4", batch=16)
    cpu = predict.predict(features, gpus=1, device="cpu:1")
    assert cpu.low < cpu.samples_per_s < cpu.high
    assert cpu.calibrated and "CPU-proxy" in cpu.basis
    h100 = predict.predict(features, gpus=1, device="NVIDIA H100 80GB HBM3")
    assert not h100.calibrated and "prior only" in h100.basis
    assert h100.samples_per_s > 10 * cpu.samples_per_s
    assert h100.low < h100.samples_per_s < h100.high
    l4 = predict.predict(features, gpus=1, device="L4")
    assert l4.samples_per_s < h100.samples_per_s  # less bandwidth, fewer FLOP/s
    two = predict.predict(dict(features, gpus=2.0), gpus=2, device="L4")
    assert two.allreduce_seconds > 0
    assert l4.samples_per_s < two.samples_per_s < 2 * l4.samples_per_s


def test_unknown_devices_and_empty_features_are_refused() -> None:
    features, _ = predict.features_for(zoo_name="mlp-w256-d2", batch=16)
    with pytest.raises(UnknownDevice, match="known"):
        predict.predict(features, device="TPU v5")
    with pytest.raises(predict.InsufficientFeatures):
        predict.predict({}, device="cpu")


def test_online_correction_moves_from_the_prior_to_the_measured_steps(corpus: dict) -> None:
    """Replay 20 real profiled steps against priors 40% off either way: the corrected estimate ends
    within 5% of what those steps measured, far closer than the prior was."""
    for point in corpus["points"][::16]:
        measured = statistics.median(point["step_samples_s"][:20])
        for prior in (measured * 1.4, measured / 1.4):
            correction = online.OnlineCorrection(prior, prior_log_sigma=0.3)
            assert correction.step_seconds() == pytest.approx(prior)
            for sample in point["step_samples_s"][:20]:
                correction.observe(sample)
            assert correction.step_seconds() == pytest.approx(measured, rel=0.05)
            low, high = correction.step_interval()
            assert low < correction.step_seconds() < high
            assert high / low < 1.5  # twenty steps narrow the interval from the prior's x/ 1.6


def test_online_correction_shrugs_off_a_stall() -> None:
    correction = online.OnlineCorrection(0.010, prior_log_sigma=0.3)
    for sample in [0.020] * 15 + [2.0]:  # one step stalled 100x
        correction.observe(sample)
    assert correction.step_seconds() == pytest.approx(0.020, rel=0.05)
    sps, low, high = correction.throughput(64)
    assert low < sps < high and sps == pytest.approx(64 / correction.step_seconds())
