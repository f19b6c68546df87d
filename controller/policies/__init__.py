"""Policies by name. Each is a pure function of (node, jobs) behind one interface, so a
benchmark compares them in one run. Add a policy here to make it selectable with
``adloader controller --policy``."""
from __future__ import annotations

import importlib

from controller.policies.base import (
    Allocation,
    JobAllocation,
    JobView,
    NodeResources,
    Policy,
    PolicyError,
    workers_for_cores,
)
from controller.policies.rules import AdaptiveRules

# name -> "module:Class"; imported on use so the controller starts without scipy when it can.
_REGISTRY: dict[str, str] = {
    "static": "controller.policies.static:StaticPolicy",
    "even": "controller.policies.even:EvenPolicy",
    "adaptive": "controller.policies.adaptive:AdaptivePolicy",
    "jct": "controller.policies.jct:JctPolicy",
    # benchmarks only: needs ADLOADER_ORACLE_CURVES (see controller/policies/oracle.py)
    "oracle": "controller.policies.oracle:OraclePolicy",
}


def policy_names() -> list[str]:
    return list(_REGISTRY)


def make_policy(name: str, rules: AdaptiveRules | None = None) -> Policy:
    """Build the policy called ``name``; PolicyError names the valid ones otherwise. ``rules``:
    which of ``adaptive``'s rules are on, for the policies built on it (an ablation; default all)."""
    target = _REGISTRY.get(name)
    if target is None:
        raise PolicyError(f"unknown policy {name!r}; choose one of {', '.join(_REGISTRY)}")
    module_name, class_name = target.split(":")
    policy_class = getattr(importlib.import_module(module_name), class_name)
    if rules is None or rules == AdaptiveRules():
        return policy_class()
    from controller.policies.adaptive import AdaptivePolicy

    return policy_class(rules=rules) if issubclass(policy_class, AdaptivePolicy) else policy_class()


__all__ = [
    "AdaptiveRules", "Allocation", "JobAllocation", "JobView", "NodeResources", "Policy", "PolicyError",
    "make_policy", "policy_names", "workers_for_cores",
]
