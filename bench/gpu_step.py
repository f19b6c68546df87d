"""A benchmark job's GPU step: emulated by a sleep, or a zoo model trained on the batch.

``sleep`` is the GPU-emulated step of every figure taken without a GPU: the CPU idles for
the step's compute time. ``cuda`` trains a model of the project's zoo (throughput_model/zoo.py)
on the batch, on the GPU: the batch is copied from pinned memory, resized on the device to
the model's input side, and a forward, backward and optimizer step are queued. ``cpu`` runs
the same training on the CPU (the dry run of that path on a machine without a GPU).

All the jobs of a node benchmark share the one GPU of a lent machine, so the model is small
(its kernels take a fraction of a millisecond) and the step is then held to the mix's
compute time, as the job's share of a larger GPU: after queueing, the step sleeps for the rest
of its compute time and then waits for its kernels; if they are not done by then, the GPU
was what limited the step, and that wait is counted (``late_s``) rather than hidden.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

COMPUTE_MODES = ("auto", "sleep", "cuda", "cpu")
DEFAULT_MODEL = "resnet-basic-w16-1x1x1-g1-i32"
"""A small ResNet of the zoo (three basic blocks, width 16, 32 px input): about a hundred
kernels a step, so that the jobs of a node benchmark together leave the one GPU mostly idle."""


def resolve(mode: str) -> str:
    """``auto``: ``cuda`` where torch sees a CUDA device, else ``sleep`` (GPU-emulated)."""
    if mode == "auto":
        return "cuda" if torch.cuda.is_available() else "sleep"
    return mode


def describe(mode: str, model: str = DEFAULT_MODEL) -> str:
    """How a run's GPU steps were made, for its results."""
    if mode == "sleep":
        return "GPU-emulated: each job's GPU step is a sleep"
    where = f"the GPU ({torch.cuda.get_device_name()}), shared by every job" if mode == "cuda" else "the CPU (dry run)"
    return (f"real training: each job trains the zoo model {model} on its batches on {where}; "
            "each step is held to the job's compute_ms_per_batch (its share of a larger GPU)")


class ModelStep:
    """One training step of a zoo model on a batch of images, queued on ``device``."""

    def __init__(self, model: str, device: str) -> None:
        from throughput_model.features import OPTIMIZERS
        from throughput_model.zoo import zoo_model

        spec = zoo_model(model)
        example = spec.batch(1)
        if example.dim() != 4:
            raise ValueError(f"{model} does not take images; name an image model of the zoo (resnet, mobile, vit)")
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.model = spec.make().to(self.device).train()
        factory = OPTIMIZERS[spec.optimizer]
        assert factory is not None
        self.optimizer = factory(self.model.parameters())
        self.side = int(example.shape[-1])

    def __call__(self, images: torch.Tensor) -> None:
        from throughput_model.zoo import classification_loss

        x = images.to(self.device, non_blocking=True)
        if x.dtype == torch.uint8:  # raw samples of a job bound by reads
            x = x.float().div_(255.0)
        if x.shape[-1] != self.side or x.shape[-2] != self.side:
            x = F.interpolate(x, size=(self.side, self.side), mode="bilinear", align_corners=False)
        self.optimizer.zero_grad(set_to_none=True)
        classification_loss(self.model(x)).backward()
        self.optimizer.step()


class HeldStep:
    """The job's GPU step: the model's training step, held to ``compute_s`` (see the module)."""

    def __init__(self, step: ModelStep, clock: Callable[[], float] = time.monotonic) -> None:
        self._step = step
        self._clock = clock
        self._cuda = step.device.type == "cuda"
        self.late_s = 0.0
        """Seconds steps ran past their compute time waiting for their kernels: the GPU was the limit."""

    def __call__(self, batch: Any, compute_s: float) -> None:
        started = self._clock()
        self._step(images_of(batch))
        done = None
        if self._cuda:
            done = torch.cuda.Event()
            done.record()
        time.sleep(max(0.0, compute_s - (self._clock() - started)))
        if done is not None and not done.query():
            waited = self._clock()
            done.synchronize()
            self.late_s += self._clock() - waited


def images_of(batch: Any) -> torch.Tensor:
    """The image tensor of a collated batch: the first tensor in it."""
    while isinstance(batch, (list, tuple)):
        batch = batch[0]
    if isinstance(batch, dict):
        return images_of(next(iter(batch.values())))
    return batch


def sleep_step(batch: Any, compute_s: float) -> None:
    """The GPU-emulated step: the CPU idles while a GPU would compute."""
    time.sleep(compute_s)
