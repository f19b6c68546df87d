"""Correct a predicted step time with the step times a running job measures.

A Bayesian blend in log space: the prediction says log(true/predicted) is about 0
with the spread the held-out evaluation found (``prior_log_sigma``); each measured
step is an observation of it with noise estimated from the steps themselves (median
absolute deviation, never below ``noise_floor``). The posterior mean uses the
median of the observations, so warm-up steps and stalls do not drag it. Few steps:
the prediction dominates; after a few dozen the measurements do.
"""
from __future__ import annotations

import math
import statistics


class OnlineCorrection:
    """Blends a predicted step time with measured ones; see the module docstring."""

    def __init__(self, predicted_step_s: float, prior_log_sigma: float, noise_floor: float = 0.03) -> None:
        if predicted_step_s <= 0 or prior_log_sigma <= 0:
            raise ValueError("predicted_step_s and prior_log_sigma must be positive")
        self.predicted_step_s = predicted_step_s
        self.prior_log_sigma = prior_log_sigma
        self.noise_floor = noise_floor
        self._logs: list[float] = []

    def observe(self, step_s: float) -> None:
        """One measured step (compute only: step time minus data wait). Non-positive values are ignored."""
        if step_s > 0 and math.isfinite(step_s):
            self._logs.append(math.log(step_s / self.predicted_step_s))

    @property
    def steps(self) -> int:
        return len(self._logs)

    def _posterior(self) -> tuple[float, float]:
        """Mean and standard deviation of log(true / predicted)."""
        prior_precision = 1.0 / self.prior_log_sigma ** 2
        if not self._logs:
            return 0.0, self.prior_log_sigma
        centre = statistics.median(self._logs)
        if len(self._logs) >= 3:
            mad = statistics.median(abs(v - centre) for v in self._logs)
            noise = max(self.noise_floor, 1.4826 * mad)
        else:
            noise = max(self.noise_floor, self.prior_log_sigma)
        # the median of n samples has about pi/2 times the variance of their mean
        data_precision = len(self._logs) / (noise ** 2 * math.pi / 2)
        precision = prior_precision + data_precision
        return data_precision * centre / precision, 1.0 / math.sqrt(precision)

    def step_seconds(self) -> float:
        """The corrected step time."""
        return self.predicted_step_s * math.exp(self._posterior()[0])

    def step_interval(self, z: float = 1.645) -> tuple[float, float]:
        """A (default 90%) interval of the step time."""
        mean, sigma = self._posterior()
        return (self.predicted_step_s * math.exp(mean - z * sigma), self.predicted_step_s * math.exp(mean + z * sigma))

    def throughput(self, samples_per_step: float) -> tuple[float, float, float]:
        """(samples/s, low, high) for ``samples_per_step`` samples per step (batch x GPUs)."""
        low_step, high_step = self.step_interval()
        return samples_per_step / self.step_seconds(), samples_per_step / high_step, samples_per_step / low_step
