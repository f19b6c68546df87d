"""``adloader.describe_model``: a model's features for the controller, counted without running it.

A thin wrapper of :func:`throughput_model.features.describe`: the job calls it once at
start (before training). In a managed job its loaders' reporter sends the flat dict in
``Report.features`` (the controller predicts M from it when the launcher's
``--model-features`` gave none); what could not be counted is logged as a warning and
marked in ``count_complete``.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from adloader import env, reporter

log = logging.getLogger(__name__)

_called = False


def was_called() -> bool:
    """Whether this process described its model itself (``adloader.autodescribe`` then stays out)."""
    return _called


def describe_model(
    model: Any,
    example_batch: Any,
    *,
    loss_fn: Callable[[Any], Any] | None = None,
    optimizer: Any = None,
    gpus: int | None = None,
) -> dict[str, float]:
    """Features of one training step of ``model`` on ``example_batch`` (see
    ``throughput_model.features.describe`` for the arguments). ``optimizer`` is best the
    ``torch.optim.Optimizer`` the job trains with (a factory or a name also do; left out, AdamW is
    assumed, said once, and the prediction's interval covers plain SGD to AdamW). ``gpus``
    defaults to the job's ``WORLD_SIZE`` and sets the all-reduce volume."""
    from throughput_model.features import describe

    global _called
    _called = True
    description = describe(model, example_batch, loss_fn=loss_fn, optimizer=optimizer,
                           gpus=gpus if gpus is not None else env.world_size())
    for note in description.notes:
        log.warning("describe_model: %s", note)
    if reporter.is_managed():
        reporter.announce_features(description.features)
    return description.features
