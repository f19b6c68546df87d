"""describe_model counts the optimizer the job really trains with: an instance, a factory or a name;
none given is said once and widens the interval; an optimizer it does not know is never an error."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from adloader import describe_model
from throughput_model import optimizers
from throughput_model.features import describe
from throughput_model.predict import predict

pytestmark = pytest.mark.pure


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 256), nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, 10))


BATCH = torch.randn(16, 128)


def _optimizer_cost(features: dict[str, float]) -> tuple[float, float]:
    return features["optimizer_bytes"] / features["param_bytes"], features["optimizer_ops"] / features["param_tensors"]


@pytest.mark.parametrize("cls, name", [(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "sgd"),
                                       (torch.optim.Adam, "adam"), (torch.optim.AdamW, "adamw")])
def test_an_optimizer_instance_counts_as_its_name_does(cls, name: str) -> None:
    model = _model()
    opt = cls(model.parameters())
    features = describe_model(model, BATCH, optimizer=opt, gpus=1)
    assert features == describe(model, BATCH, optimizer=name).features
    assert (features["optimizer_low"], features["optimizer_high"]) == (1.0, 1.0)
    assert all(p.device.type == "cpu" for p in model.parameters())  # the job's model untouched
    assert not opt.state  # and its optimizer never stepped


def test_sgd_and_adamw_instances_differ_as_their_state_does() -> None:
    model = _model()
    sgd = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).features)
    adamw = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.AdamW(model.parameters())).features)
    assert sgd == (3.0, 1.0)  # read parameter and gradient, write the parameter; one op per tensor
    assert adamw[0] > 5 * sgd[0] and adamw[1] > 5 * sgd[1]


def test_the_options_that_change_the_cost_are_counted() -> None:
    model = _model()
    plain = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).features)
    momentum = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)).features)
    assert momentum[0] > plain[0] and momentum[1] > plain[1]
    single = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.AdamW(model.parameters())).features)
    foreach = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.AdamW(model.parameters(),
                                                                                foreach=True)).features)
    fused = _optimizer_cost(describe(model, BATCH, optimizer=torch.optim.AdamW(model.parameters(),
                                                                              fused=True)).features)
    assert foreach[1] < single[1]  # fewer, multi-tensor ops
    assert fused == (7.0, 1.0)  # parameter, gradient and two moments read, three written; one kernel per tensor


def test_param_groups_count_only_what_the_optimizer_holds() -> None:
    model = _model()
    first, last = model[0], model[3]
    both = torch.optim.SGD([{"params": first.parameters()}, {"params": last.parameters(), "momentum": 0.9}], lr=0.1)
    only_first = torch.optim.SGD(first.parameters(), lr=0.1)
    held = describe(model, BATCH, optimizer=only_first).features
    assert held["optimizer_bytes"] == pytest.approx(3.0 * sum(p.numel() * 4 for p in first.parameters()))
    grouped = describe(model, BATCH, optimizer=both).features
    assert grouped["optimizer_bytes"] > held["optimizer_bytes"] + 3.0 * sum(p.numel() * 4 for p in last.parameters())


def test_a_factory_a_class_and_any_torch_optim_name() -> None:
    model = _model()
    by_factory = describe(model, BATCH, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)).features
    assert by_factory == describe(model, BATCH, optimizer="SGD").features
    assert describe(model, BATCH, optimizer=torch.optim.RMSprop).features == describe(model, BATCH,
                                                                                     optimizer="rmsprop").features
    with pytest.raises(ValueError, match="unknown optimizer 'nadamx'"):
        describe(model, BATCH, optimizer="nadamx")


def test_none_given_is_said_once_and_widens_the_interval(caplog) -> None:
    model = _model()
    optimizers._said.clear()
    with caplog.at_level(logging.WARNING, logger="throughput_model.optimizers"):
        assumed = describe_model(model, BATCH, gpus=1)
        again = describe_model(model, BATCH, gpus=1)
    said = [r.getMessage() for r in caplog.records if "no optimizer given" in r.getMessage()]
    assert len(said) == 1 and "AdamW" in said[0]
    assert assumed == again and assumed["optimizer_low"] < 0.2 and assumed["optimizer_high"] == 1.0
    given = describe(model, BATCH, optimizer=torch.optim.AdamW(model.parameters())).features
    wide, narrow = predict(assumed, device="cpu"), predict(given, device="cpu")
    assert wide.samples_per_s == pytest.approx(narrow.samples_per_s)
    assert wide.high > narrow.high and wide.low == pytest.approx(narrow.low)
    cheapest = predict(describe(model, BATCH, optimizer="sgd-plain").features, device="cpu")
    assert wide.low <= cheapest.samples_per_s <= wide.high
    assert any("optimizer" in note for note in wide.notes)
    gpu_wide, gpu_narrow = predict(assumed, device="H100"), predict(given, device="H100")
    assert gpu_wide.high > gpu_narrow.high


class _LoggingAdamW(torch.optim.AdamW):
    """A job's own subclass of a torch optimizer."""


class _SignSGD(torch.optim.Optimizer):
    """An optimizer torch does not ship: one state tensor per parameter."""

    def __init__(self, params, lr: float = 0.01) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    buf = self.state[p].setdefault("buf", torch.zeros_like(p))
                    buf.mul_(0.9).add_(p.grad)
                    p.add_(buf.sign(), alpha=-group["lr"])


def test_unknown_optimizers_are_estimated_never_refused(caplog) -> None:
    model = _model()
    optimizers._said.clear()
    with caplog.at_level(logging.WARNING, logger="throughput_model.optimizers"):
        sub = describe(model, BATCH, optimizer=_LoggingAdamW(model.parameters())).features
        fresh = _SignSGD(model.parameters())
        unknown = describe(model, BATCH, optimizer=fresh).features
    assert _optimizer_cost(sub) == _optimizer_cost(describe(model, BATCH, optimizer="adamw").features)
    assert (sub["optimizer_low"], sub["optimizer_high"]) == optimizers.SUBCLASS_RANGE
    assert (unknown["optimizer_low"], unknown["optimizer_high"]) == optimizers.UNKNOWN_RANGE
    assert sum("_SignSGD is unknown" in r.getMessage() for r in caplog.records) == 1
    widest = predict(unknown, device="cpu")
    for name in ("sgd-plain", "sgd", "adamw"):
        assert widest.low <= predict(describe(model, BATCH, optimizer=name).features).samples_per_s <= widest.high

    model(BATCH).sum().backward()
    fresh.step()  # now it holds one state tensor per parameter: estimated as a momentum step
    stepped = describe(model, BATCH, optimizer=fresh).features
    assert _optimizer_cost(stepped) == optimizers.FALLBACK_COST["sgd"]
    assert (stepped["optimizer_low"], stepped["optimizer_high"]) == optimizers.STATE_RANGE


class _TiedLM(nn.Module):
    """A language model whose output head shares the embedding's weight (as most do)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(500, 64)
        self.body = nn.Linear(64, 64)
        self.head = nn.Linear(64, 500, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.embed(ids))))


def test_tied_weights_are_counted_once_and_stay_tied() -> None:
    model = _TiedLM()
    description = describe(model, torch.randint(0, 500, (4, 16)), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert description.features["count_complete"] == 1.0, description.notes
    assert description.features["params"] == sum(p.numel() for p in model.parameters())  # the table once
    assert description.features["param_tensors"] == 3.0
