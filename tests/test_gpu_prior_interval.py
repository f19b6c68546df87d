"""The GPU roofline prior's interval is wide enough to be true: it holds published GPU training
throughputs, and the same rule on this CPU (the one device measured here) holds the corpus."""
from __future__ import annotations

import functools

import pytest
import torch

from throughput_model.features import describe
from throughput_model.corpus import load_corpus
from throughput_model.fit import corpus_device
from throughput_model.predict import predict, roofline_prior
from throughput_model.zoo import classification_loss, resnet50

pytestmark = pytest.mark.pure

PUBLISHED = [
    # NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training
    # performance", 1 GPU, pytorch-21.03 NGC container, SGD momentum 0.875, batch 256 (img/s).
    ("A100", "TF32", 938.0),
    ("A100", "mixed precision", 2470.0),
    ("V100", "FP32", 367.0),
    ("V100", "mixed precision", 1200.0),
]


@functools.cache
def _resnet50_features() -> dict[str, float]:
    optimizer = lambda p: torch.optim.SGD(p, lr=0.256, momentum=0.875, weight_decay=1 / 32768)  # noqa: E731
    return describe(resnet50(), torch.randn(256, 3, 224, 224), loss_fn=classification_loss,
                    optimizer=optimizer).features


@pytest.mark.parametrize("device, precision, img_per_s", PUBLISHED, ids=[f"{d}-{p}" for d, p, _ in PUBLISHED])
def test_published_resnet50_training_throughput_lies_in_the_prior_interval(device: str, precision: str,
                                                                          img_per_s: float) -> None:
    prediction = predict(_resnet50_features(), device=device)
    assert not prediction.calibrated
    assert prediction.low <= img_per_s <= prediction.high, (precision, prediction.summary())


def test_the_prior_rule_on_this_cpu_holds_nine_in_ten_of_the_corpus() -> None:
    """The only device measured here: the GPU prior's rule (efficiency range, launch range), given the
    CPU's measured peaks, must hold at least 90 % of the shipped corpus's measured steps."""
    corpus = load_corpus()
    device = corpus_device(corpus)
    inside = []
    for point in corpus["points"]:
        _, slow, fast = roofline_prior(point["features"], device)
        inside.append(fast <= point["step_s"] <= slow)
    assert sum(inside) / len(inside) >= 0.9
