"""Which of ``adaptive``'s rules around its linear program are on.

Each rule was added to fix one case; an ablation (``python -m bench.ablation``) turns them off one
at a time to measure what each still buys. Every rule is on by default, and a policy built with
the default ``AdaptiveRules()`` is the product exactly. ``adloader controller``, ``adloader
bench`` and ``python -m bench.simulate`` take ``--without RULE[,RULE]`` for the ablation only.
Each field's docstring says what the rule does; docs/policies.md says why, under its principle.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

from controller.policies.base import PolicyError


@dataclass(frozen=True)
class AdaptiveRules:
    """One flag per rule, all on by default (``adaptive`` as shipped)."""

    curve_only: bool = True
    """A job is planned from its model only once its loading curve is known (before: its even
    placeholder), not from one early window's loading cost (shares.measured_model)."""
    outgrown_models: bool = True
    """A job that used clearly more cores than its model plans is planned dearer at once, until
    its curve follows (outgrown.followed)."""
    contended_reads: bool = True
    """Reads are throttled only while readers contend for the device (shares.contended_bandwidth);
    off: whenever the bandwidth is managed."""
    kept_beside_newcomers: bool = True
    """While a job is not yet measured, measured core-bound jobs keep their workers
    (adaptive._workers_kept_beside_newcomers)."""
    idle_workers: bool = True
    """A reader keeping up with its GPUs on idle workers gets only those it loads with
    (adaptive._without_idle_workers)."""
    equal_worth: bool = True
    """Jobs worth the same per core up to noise are pooled and kept equally busy
    (worth.pool_equal_worth, the program's max-min term per group)."""
    hysteresis: bool = True
    """The current allocation is kept unless the plan gains more than ``gain_threshold``
    (off: any predicted gain changes it)."""
    first_plan_bar: bool = True
    """At a first plan or a departure the bar is ``first_plan_gain``, not ``gain_threshold``."""
    newcomers_within_noise: bool = True
    """A first plan is made where the placeholder satisfies the newcomer only within its young
    curve's noise (adaptive._newcomers_satisfied_within_noise)."""
    once_a_minute: bool = True
    """Once settled, a job's limits change at most once per ``min_change_interval_s`` short of an
    urgent gain (adaptive._too_soon)."""
    finishing_order: bool = True
    """A job clearly longer per GPU than another weighs ``FINISH_FACTOR`` times less (ranks.py)."""
    ranks_at_node_rate: bool = True
    """Run lengths are ranked at the rate the whole node can give each job, not at full speed
    (ranks.at_node_rate)."""
    completion_check: bool = True
    """A plan that starves a job is held when it finishes the jobs later, GPU-weighted
    (adaptive._finishes_later, completion.py)."""
    evens_outgrown: bool = True
    """A group of equals a job outgrew its model into is evened out without a gain
    (adaptive._evens_outgrown)."""
    safety_net: bool = True
    """A plan that made a job clearly slower is given back (controller/safety_net.py; the loop's,
    so it acts under every policy)."""

    def without(self, names: Iterable[str]) -> AdaptiveRules:
        """These rules with ``names`` turned off; PolicyError names the rules for an unknown one."""
        names = [name.strip() for name in names if name.strip()]
        unknown = [name for name in names if name not in RULES]
        if unknown:
            raise PolicyError(f"no rule named {', '.join(unknown)}: --without takes a comma-separated list of "
                              f"{', '.join(RULES)}")
        return dataclasses.replace(self, **dict.fromkeys(names, False))

    @property
    def off(self) -> tuple[str, ...]:
        """The rules turned off, in declaration order."""
        return tuple(name for name in RULES if not getattr(self, name))


RULES: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(AdaptiveRules))
"""Every rule's name, as ``--without`` takes it."""


def parse_without(text: str | None) -> AdaptiveRules:
    """The rules with those of ``text`` (``"a,b"``; None or empty: none) turned off."""
    return AdaptiveRules().without((text or "").split(","))
