"""Features from a model's structure, counted on the meta device: checked against hand-derived counts."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from adloader import protocol
from throughput_model.counting import (
    COMPUTE_CLASSES,
    OP_CLASSES,
    StepAccountant,
    account_step,
    direct_depthwise_forward_max_padding,
)
from throughput_model import features as features_module
from throughput_model.features import FEATURE_KEYS, MAX_KEYS, describe
from throughput_model.predict import InsufficientFeatures, predict
from throughput_model.zoo import FAMILIES, ZOO, classification_loss, resnet50


def _describe(spec, batch: int):
    return describe(spec.make(), spec.batch(batch), loss_fn=classification_loss, optimizer=spec.optimizer)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_counted_completely_and_compactly(family: str) -> None:
    spec = next(m for m in ZOO if m.family == family)
    description = _describe(spec, spec.batches[0])
    features = description.features
    assert set(features) == set(FEATURE_KEYS) and len(features) <= MAX_KEYS
    assert all(isinstance(v, float) and math.isfinite(v) for v in features.values())
    assert features["count_complete"] == 1.0, description.notes
    assert features["batch_size"] == spec.batches[0]
    flops = features["flops_forward"] + features["flops_backward"]
    assert flops > 0 and features["ops_total"] > 0
    assert flops == pytest.approx(sum(features[f"{c}_flops"] for c in COMPUTE_CLASSES))
    assert sum(features[f"{c}_bytes"] for c in OP_CLASSES) > features["param_bytes"]
    assert features["optimizer_ops"] > 0 and features["optimizer_bytes"] >= 2 * features["param_bytes"]


def test_features_travel_in_a_register_message() -> None:
    spec = ZOO[0]
    message = protocol.Register(name="job", gpus=2, features=_describe(spec, 16).features)
    assert protocol.decode(protocol.encode(message)) == message


def test_mlp_flops_and_bytes_match_hand_counts() -> None:
    batch, sizes = 32, [(784, 256), (256, 256), (256, 10)]
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    features = describe(model, torch.randn(batch, 784), optimizer="sgd").features
    forward = sum(2 * batch * i * o for i, o in sizes)
    # backward: grad of the weights for every layer, grad of the input for all but the first
    backward = sum(2 * batch * i * o for i, o in sizes) + sum(2 * batch * i * o for i, o in sizes[1:])
    assert features["flops_forward"] == forward
    assert features["flops_backward"] == backward
    assert features["gemm_flops"] == forward + backward
    params = sum(i * o + o for i, o in sizes)
    assert features["params"] == params and features["param_bytes"] == 4 * params
    # PyTorch's FLOP formulas cover matmul/conv/attention only, so ReLU and its backward are counted in
    # bytes: each reads and writes a (batch x 256) float tensor, the backward also reads the mask input
    assert "elementwise_flops" not in features
    assert features["elementwise_bytes"] >= 2 * (2 + 3) * 4 * batch * 256
    assert features["elementwise_ops"] == 5  # 2 relu, 2 threshold_backward, the ones_like seeding backward


def test_convolution_flops_match_the_formula() -> None:
    batch = 4
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16))
    features = describe(model, torch.randn(batch, 3, 32, 32), optimizer="none").features
    dense = 2 * batch * 32 * 32 * 16 * 3 * 9
    depthwise = 2 * batch * 32 * 32 * 16 * 9
    assert features["flops_forward"] == dense + depthwise
    # backward: input and weight gradients, each as costly as the forward (PyTorch's own formula
    # would count the depthwise weight gradient 16 times, once per group)
    assert features["conv_depthwise_flops"] == 3 * depthwise
    assert features["conv_flops"] == 2 * dense  # the first layer needs no input gradient
    assert features["optimizer_ops"] == 0


def _depthwise_1d(taps: int) -> nn.Module:
    return nn.Conv1d(16, 16, taps, padding=taps // 2, groups=16, bias=False)


@pytest.mark.parametrize("taps, forward_lowered, weight_grad_lowered", [(3, False, False), (5, False, True),
                                                                       (15, True, True)])
def test_wide_depthwise_convolutions_count_their_column_buffers(taps: int, forward_lowered: bool,
                                                                weight_grad_lowered: bool) -> None:
    """The forward pass of a depthwise convolution padded wider than 6 (AVX-512) or 4 (AVX2) and its
    weight gradient wider than 3 taps run as im2col + GEMM: each writes and reads a column buffer
    of taps x outputs."""
    batch, length = 4, 100
    features = describe(_depthwise_1d(taps), torch.randn(batch, 16, length), optimizer="none").features
    column = batch * 16 * length * taps * 4
    assert features["conv_depthwise_lowered"] == 2 * column * (int(forward_lowered) + int(weight_grad_lowered))


def test_a_depthwise_forward_is_lowered_by_its_padding_against_this_cpus_unroll() -> None:
    """oneDNN's direct kernel computes 6 outputs at once on AVX-512, 4 on AVX2, 3 below, and takes
    no padding wider: a "same"-padded 13-tap forward pass (6 each side) is direct on AVX-512 and
    lowered on AVX2, and an unpadded 33-tap one is direct everywhere."""
    assert [direct_depthwise_forward_max_padding(c) for c in ("AVX512", "AVX2", "DEFAULT")] == [6, 4, 3]
    batch, length = 4, 100
    here = direct_depthwise_forward_max_padding()
    column = batch * 16 * length * 13 * 4
    features = describe(_depthwise_1d(13), torch.randn(batch, 16, length), optimizer="none").features
    assert features["conv_depthwise_lowered"] == 2 * column * (int(6 > here) + 1)  # the weight gradient: lowered
    unpadded = nn.Conv1d(16, 16, 33, groups=16, bias=False)
    features = describe(unpadded, torch.randn(batch, 16, length), optimizer="none").features
    assert features["conv_depthwise_lowered"] == 2 * (batch * 16 * (length - 32) * 33 * 4)  # its weight gradient's only
    square = describe(nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.randn(2, 16, 8, 8), optimizer="none")
    assert square.features["conv_depthwise_lowered"] == 0


_ONEDNN_PROBE = """
import sys, torch
conv = torch.nn.Conv1d(16, 16, int(sys.argv[1]), padding=int(sys.argv[1]) // 2, groups=16, bias=False)
conv(torch.randn(2, 16, 256, requires_grad=True)).sum().backward()
"""


@pytest.mark.parametrize("taps", [3, 5, 9, 11, 13, 14, 15, 33])
def test_the_lowering_rule_is_what_onednn_runs_here(taps: int) -> None:
    """What the counting calls lowered is what oneDNN reports it ran as a GEMM (``gemm``), the rest
    its direct depthwise kernel (``jit_dw``), pass by pass."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", _ONEDNN_PROBE, str(taps)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    ran = {}
    for line in run.stdout.splitlines():
        fields = line.split(",")
        if len(fields) > 6 and fields[2:5] == ["primitive", "exec", "cpu"] and fields[5] == "convolution":
            ran[fields[7]] = fields[6]
    if not any(impl.startswith("jit_dw") for impl in ran.values()):
        pytest.skip(f"oneDNN on this CPU has no direct depthwise kernel (ran {ran or 'nothing'}): the rule is x86's")
    features = describe(_depthwise_1d(taps), torch.randn(2, 16, 256), optimizer="none").features
    outputs = 2 * 16 * (256 + 2 * (taps // 2) - taps + 1)
    column = 2 * outputs * taps * 4  # written, then read back
    lowered = {"forward_training": "gemm" in ran["forward_training"], "backward_weights": "gemm" in ran["backward_weights"]}
    assert "jit_dw" in ran["backward_data"]
    assert features["conv_depthwise_lowered"] == column * sum(lowered.values()), ran


def test_attention_is_one_region_and_its_projections_stay_matmuls() -> None:
    spec = next(m for m in ZOO if m.family == "decoder")
    features = _describe(spec, 2).features
    assert features["attention_flops"] > 0 and features["gemm_flops"] > features["attention_flops"]
    encoder = next(m for m in ZOO if m.family == "encoder")  # nn.MultiheadAttention goes through the same region
    features = _describe(encoder, 2).features
    assert features["attention_flops"] > 0 and features["gemm_flops"] > 0


def test_a_long_rnn_is_counted_on_a_probe_of_its_sequence() -> None:
    """Counting probes of 2 and 4 steps and extrapolating gives the FLOPs of counting all 24 steps.
    Ops and bytes come out a little lower: the full meta decomposition handles the gradient of every
    step's output with extra ops and a full-length buffer (select_backward), which grows with the
    square of the length and which no fused RNN kernel does."""
    model = nn.LSTM(16, 32, num_layers=2, batch_first=True).to("meta")
    x = torch.empty(3, 24, 16, device="meta")

    def step():
        out, _ = model(x)
        return out.sum()

    probed = account_step(step, None).tally.classes["lstm"]
    full_regions = account_step(step, None, probe_steps=1000).tally.classes["lstm"]
    assert probed.flops == pytest.approx(full_regions.flops, rel=1e-9)
    assert probed.ops == pytest.approx(full_regions.ops, rel=0.1)
    assert 0.7 * full_regions.bytes < probed.bytes < full_regions.bytes


@pytest.mark.parametrize("sparse", [False, True])
def test_embedding_lookups_read_their_rows_and_gradients_follow_the_sparse_flag(sparse: bool) -> None:
    """A 50k-row table looked up by 64 bags of 8 indices: the forward reads 512 rows, not the table;
    a dense gradient writes the whole table (and plain SGD then streams it), a sparse one writes one
    row (and its index) per looked-up index, and the optimizer touches only those rows."""
    rows, dim, batch, bag = 50_000, 32, 64, 8
    table = rows * dim * 4
    looked_up = batch * bag * dim * 4
    with StepAccountant() as forward_only:
        nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse).to("meta")(torch.zeros(batch, bag, dtype=torch.long,
                                                                                     device="meta"))
    lookup = forward_only.tally.classes["embedding"].bytes
    assert looked_up < lookup < 2 * looked_up  # the rows, the int64 indices and offsets, the pooled output
    features = describe(nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse), torch.randint(0, rows, (batch, bag)),
                        optimizer="sgd-plain").features
    assert features["count_complete"] == 1.0
    assert features["embedding_ops"] == 2  # one lookup, one gradient
    gradient = features["embedding_bytes"] - lookup
    if sparse:
        assert gradient == pytest.approx(batch * bag * (dim * 4 + 8) + batch * dim * 4, rel=0.5)
        assert features["embedding_alloc"] == 0 and features["optimizer_bytes"] < table / 4
    else:
        assert gradient >= table and features["embedding_alloc"] >= table
        assert features["optimizer_bytes"] >= 3 * table  # read the parameter and its gradient, write the parameter


def test_resnet50_is_described_completely_without_touching_the_model() -> None:
    model = resnet50()
    before = {n: p.detach().clone() for n, p in list(model.named_parameters())[:3]}
    description = describe(model, torch.randn(8, 3, 224, 224), optimizer="sgd")
    features = description.features
    assert features["count_complete"] == 1.0
    assert features["params"] == pytest.approx(25.557e6, rel=1e-3)
    # ~4.1 GMAC forward per 224x224 image; a training step is about 3x the forward FLOPs
    assert features["flops_forward"] / 8 == pytest.approx(8.2e9, rel=0.03)
    assert features["flops_backward"] == pytest.approx(2 * features["flops_forward"], rel=0.02)
    for name, value in before.items():
        parameter = dict(model.named_parameters())[name]
        assert parameter.device.type == "cpu" and torch.equal(parameter, value)
    print(f"ResNet-50 described in {description.seconds:.2f} s")


class DataDependent(nn.Module):
    """Branches on a tensor's value: impossible on meta tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.sum().item() > 0 else self.b(x)


def test_a_forward_that_reads_a_value_is_counted_on_cpu_stand_ins() -> None:
    model, batch = DataDependent(), torch.randn(4, 8)
    before = [p.clone() for p in model.parameters()]
    description = describe(model, batch)
    assert description.features["count_complete"] == 1.0
    assert any("Tensor.item()" in note and "CPU stand-ins" in note for note in description.notes)
    assert description.features["flops_forward"] == describe(nn.Linear(8, 8), batch).features["flops_forward"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model is untouched


class ChecksItsInput(DataDependent):
    """Refuses a constant input, as a model may check its data: the stand-ins cannot run it either."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.max().item() == x.min().item():
            raise ValueError("a constant batch")
        return self.a(x)


def test_what_cannot_be_counted_is_said(monkeypatch) -> None:
    description = describe(ChecksItsInput(), torch.randn(4, 8))
    assert description.features["count_complete"] == 0.0
    assert any("stand-ins too (ValueError: a constant batch)" in note for note in description.notes)
    assert any("constant value reads on the meta device too (ValueError" in note for note in description.notes)
    assert any("could not count the forward" in note for note in description.notes)
    assert description.features["params"] == 2 * (64 + 8)  # parameter sizes are still known
    # a step estimated from its optimizer alone is no prediction: the job is measured only
    with pytest.raises(InsufficientFeatures, match="forward pass could not be counted"):
        predict(description.features, device="H100")


class ChecksItsActivations(DataDependent):
    """Fails after its first layer has run, wherever it runs: on constant stand-ins and constant reads
    alike the activations are constant."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.a(x)
        if hidden.max().item() == hidden.min().item():
            raise ValueError("constant activations")
        return self.b(hidden)


def test_a_forward_that_fails_part_way_keeps_nothing_of_what_ran_and_is_not_predicted() -> None:
    """What ran before the failure is a fraction of the step: predicting from it was 111x too fast on
    a public model (nemo_speechlm, whose forward failed after its first layers)."""
    description = describe(ChecksItsActivations(), torch.randn(4, 8))
    features = description.features
    assert features["count_complete"] == 0.0 and features["flops_forward"] == 0.0 and features["ops_total"] == 0
    assert all(features[f"{c}_bytes"] == 0 for c in ("gemm", "reduction", "optimizer"))
    assert features["params"] == 2 * (64 + 8)
    assert any("not predicted" in note for note in description.notes)
    with pytest.raises(InsufficientFeatures, match="forward pass could not be counted"):
        predict(features, device="cpu")


def test_a_model_too_large_to_replay_is_counted_with_constant_reads(monkeypatch) -> None:
    """A model over the replay limit that reads a value is counted on the meta device, not left unpredicted."""
    monkeypatch.setattr(features_module, "REPLAY_MAX_BYTES", 100)
    batch = torch.randn(4, 8)
    too_large = describe(DataDependent(), batch)
    assert too_large.features["count_complete"] == 1.0
    assert any("too large to replay" in note for note in too_large.notes)
    assert any("each read answered by a constant" in note for note in too_large.notes)
    assert too_large.features["flops_forward"] == describe(nn.Linear(8, 8), batch).features["flops_forward"] > 0
    assert predict(too_large.features, device="H100").samples_per_s > 0


class NoBackward(nn.Module):
    """Its backward takes a shape from the data (``nonzero``): forward counts, backward fails after
    its head's gradients have been counted."""

    class _Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            return grad * grad.nonzero().shape[0]

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self._Op.apply(self.layer(x)))


def test_a_failed_backward_is_estimated_from_the_forward(monkeypatch) -> None:
    monkeypatch.setattr(features_module, "REPLAY_MAX_BYTES", 0)  # no replay on stand-ins
    description = describe(NoBackward(), torch.randn(4, 8), optimizer="adam")
    features = description.features
    assert features["count_complete"] == 0.0
    assert any("backward" in note for note in description.notes)
    assert features["flops_backward"] == 2 * features["flops_forward"] > 0
    # the head's gradients, counted before the failure, are not counted again on top of the estimate
    assert features["gemm_flops"] == 3 * features["flops_forward"]
    assert features["optimizer_bytes"] > 0 and features["optimizer_ops"] > 0
    assert predict(features, device="H100").samples_per_s > 0  # the forward counted: predicted, widened


def test_allreduce_volume_follows_the_gpu_count() -> None:
    spec = ZOO[0]
    one = describe(spec.make(), spec.batch(16), gpus=1).features
    four = describe(spec.make(), spec.batch(16), gpus=4).features
    assert one["allreduce_bytes"] == 0
    assert four["allreduce_bytes"] == pytest.approx(2 * 3 / 4 * four["grad_bytes"])


def test_describe_model_in_the_job_uses_world_size(monkeypatch) -> None:
    import adloader

    monkeypatch.setenv("WORLD_SIZE", "2")
    features = adloader.describe_model(nn.Linear(16, 4), torch.randn(8, 16))
    assert features["gpus"] == 2 and features["allreduce_bytes"] == features["grad_bytes"]
