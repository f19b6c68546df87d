"""A job whose loading got dearer than its curve says, seen in the cores it uses.

A loading curve follows a dearer phase only once 16 windows in a row lie beyond 1.5x of it (the
change point of throughput_model/curves.py), and a job's windows count its rate in whole
batches. Until then the plan gives it the cores of its old phase. A job the plan satisfies
holds a large CPU weight and takes what it now wants: on the node's crossing pair
(bench/mixes/crossing_pair_sharp.json) the job that got dearer kept weight 1172 against its
neighbour's 36 for about 20 s and took 1.95 of the 2 cores, while the neighbour, now the
cheaper job, was starved so far that its training process woke 60 ms late from every 40 ms
step (bench/trainer_stall.py).

A job's CPU time is read exactly every window. When a job with a mature curve used clearly
more cores over its last window than its model plans for the rate it delivered (more than
``OUTGROWN`` times, and ``OUTGROWN_MIN_EXCESS`` cores beyond), each of its samples now costs
more: the plan uses its model made dearer (:func:`followed`), by the excess discounted for the
window's counting noise, so that it weighs the job at its new cost at once, until the curve has
followed and the two agree. ``adaptive`` then evens out a group of jobs worth the same that the
job has entered, where that does not finish the jobs later (controller/policies/adaptive.py),
and the safety net judges the plan by the same model (controller/safety_net.py). Pure.
"""
from __future__ import annotations

import math

from controller.policies.base import JobView
from controller.policies.shares import PLAN_MARGIN, JobModel
from controller.policies.worth import EVIDENCE_Z, young_curve

OUTGROWN = 1.3
"""A job using more than this times the cores its model plans for the rate it delivered has
outgrown its model. Planned cores are PLAN_MARGIN (1.15x) above the use the curve saw, so
this is 1.5x that use: beyond the few percent a window's CPU time and batch count swing."""
OUTGROWN_MIN_EXCESS = 0.25
"""...and at least this many cores more, so that a light job's bursts are not taken for a phase."""
MIN_WINDOW_BATCHES = 16
"""A window counting fewer batches says too little of the job's rate to be read at all."""


def outgrowth(job: JobView, model: JobModel) -> float | None:
    """How many times dearer ``model`` is made for ``job`` when the job has outgrown it: the
    cores it used over its last window against those the model's curve saw used for its rate,
    discounted by EVIDENCE_Z standard deviations of the window's counting noise (its rate is
    counted in whole batches: at 12 a window a job was seen 1.5x dearer by chance, and a plan
    that followed such readings traded two jobs back and forth on simulated 2-core mix 2-1).
    None when it has not outgrown it, its curve is young, or the window counted too little."""
    used, rate, batches = job.cores_used, job.achieved, job.window_batches
    if young_curve(job) or not job.loading_curve or used is None or rate is None or rate <= 0 or not batches:
        return None
    planned = model.cores_for(rate)
    if not (math.isfinite(planned) and planned > 0):
        return None
    if batches < MIN_WINDOW_BATCHES or used <= max(OUTGROWN * planned, planned + OUTGROWN_MIN_EXCESS):
        return None
    factor = used / planned * math.exp(-EVIDENCE_Z / math.sqrt(batches)) * PLAN_MARGIN
    return factor if factor > 1.0 else None


def followed(job: JobView, model: JobModel) -> JobModel:
    """``model``, made dearer by the job's :func:`outgrowth` where it has outgrown it (else
    ``model`` itself): the model its plan and the safety net's judgement of that plan use."""
    factor = outgrowth(job, model)
    return model if factor is None else model.dearer(factor)
