"""Each of ``adaptive``'s rules can be turned off alone, for the ablation (controller/policies/rules.py,
``python -m bench.ablation``), and each flag is wired: the test written for its rule passes with
every rule on and fails with that rule off. Every rule on is the product: ``make_policy`` and
``AdaptivePolicy()`` build it with ``AdaptiveRules()``.
"""
from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Callable

import pytest

import test_change_rate
import test_completion_check
import test_flapping
import test_outgrown
import test_policies
import test_safety_net
from bench.ablation import ablate, compared, effect, node_command, node_runner
from bench.runner import BenchError, NodeSetup, _controller_options, run_dir_name, split_variant
from controller.policies import AdaptiveRules, JobView, PolicyError, make_policy
from controller.policies import adaptive
from controller.policies.adaptive import AdaptivePolicy
from controller.policies.rules import RULES, parse_without
from controller.safety_net import SafetyNet


def test_a_newcomer_is_planned_from_its_curve_only() -> None:
    """One window's loading cost (``cpu_s_per_sample``) is no basis for a plan: the newcomer holds
    its even placeholder until its curve is known, while the job beside it is planned."""
    known = test_policies.job("known", m=400.0, p=0.01)  # would use all 4 cores
    newcomer = JobView(job_id="new", name="new", gpus=1, max_throughput=100.0, cpu_s_per_sample=0.001)
    on = AdaptivePolicy().allocate(test_policies.NODE, [known, newcomer])
    assert test_policies.planned(on["new"]) == pytest.approx(test_policies.NODE.cores / 2, abs=0.01)
    assert test_policies.planned(on["new"]) == pytest.approx(test_policies.planned(on["known"]), abs=0.01)
    off = AdaptivePolicy(rules=AdaptiveRules().without(["curve_only"])).allocate(test_policies.NODE, [known, newcomer])
    assert test_policies.is_satisfied(off["new"]) and test_policies.planned(off["new"]) < 0.5


RULE_TESTS: dict[str, Callable[..., None]] = {
    "curve_only": test_a_newcomer_is_planned_from_its_curve_only,
    "outgrown_models": test_outgrown.test_adaptive_evens_out_the_equals_a_job_outgrew_its_model_into,
    "contended_reads": test_policies.test_a_lone_reader_is_not_throttled_a_newcomer_that_reads_brings_throttles_back,
    "kept_beside_newcomers": test_policies.test_a_measured_job_keeps_its_workers_while_newcomers_hold_placeholders,
    "idle_workers":
        test_change_rate.test_a_reader_whose_workers_mostly_wait_sheds_them_at_once_while_settling_once_a_minute_after,
    "equal_worth": test_flapping.test_jobs_worth_the_same_up_to_noise_get_the_same_weight_and_workers,
    "hysteresis": test_change_rate.test_the_jobs_left_are_planned_at_the_step_a_job_departs_on_the_lower_bar,
    "first_plan_bar": test_change_rate.test_a_job_is_planned_at_the_step_its_model_becomes_known_on_a_lower_bar,
    "newcomers_within_noise": test_change_rate.
    test_a_first_plan_is_not_held_on_a_placeholder_that_satisfies_a_young_curve_only_within_its_noise,
    "once_a_minute": test_change_rate.test_a_settled_job_keeps_its_limits_for_a_minute_unless_the_gain_is_urgent,
    "finishing_order": test_policies.test_adaptive_serves_first_the_job_clearly_shortest_per_gpu,
    "ranks_at_node_rate": test_policies.test_adaptive_serves_first_the_job_clearly_shortest_per_gpu,
    "completion_check": test_completion_check.test_a_plan_that_starves_small_jobs_for_a_little_rate_is_not_made,
    "evens_outgrown": test_outgrown.test_adaptive_evens_out_the_equals_a_job_outgrew_its_model_into,
}
"""For each rule of ``adaptive``, the test that shows what it does (the safety net's is below)."""


def test_every_rule_of_the_policy_has_its_test() -> None:
    assert set(RULE_TESTS) == set(RULES) - {"safety_net"}


@pytest.mark.parametrize("rule", sorted(RULE_TESTS))
def test_a_rules_own_test_fails_with_that_rule_alone_off(
        rule: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    test = RULE_TESTS[rule]
    if "caplog" in inspect.signature(test).parameters:
        test = functools.partial(test, caplog=caplog)
    test()  # every rule on
    caplog.clear()
    # every policy the test builds without naming its rules gets all but this one
    monkeypatch.setattr(adaptive, "AdaptiveRules", lambda: AdaptiveRules().without([rule]))
    with pytest.raises(AssertionError):
        test()


def test_the_safety_net_off_gives_nothing_back() -> None:
    """The cut that the net takes back after three slow steps (test_safety_net) stays, unjudged."""
    for enabled, at_step_9 in ((True, test_safety_net.BEFORE), (False, test_safety_net.CUT)):
        clock = test_safety_net.Clock()
        net = SafetyNet(clock=clock, settle_s=5.0, confirm_steps=3, hold_s=60.0, enabled=enabled)
        applied = test_safety_net.run(net, clock, [100.0] * 5 + [60.0] * 13)
        assert applied[9] == at_step_9 and net.reverts == int(enabled)


def test_every_rule_is_on_by_default_and_make_policy_passes_rules_to_the_policies_built_on_adaptive() -> None:
    assert all(getattr(AdaptiveRules(), rule) for rule in RULES) and AdaptiveRules().off == ()
    assert AdaptivePolicy().rules == AdaptiveRules() == make_policy("adaptive").rules
    rules = parse_without("finishing_order, safety_net")
    assert rules.off == ("finishing_order", "safety_net")
    assert make_policy("adaptive", rules).rules == rules == make_policy("jct", rules).rules
    assert make_policy("even", rules).name == "even"  # no rule of adaptive's to turn off
    assert parse_without(None) == parse_without("") == AdaptiveRules()


def test_an_unknown_rule_is_refused_naming_every_rule() -> None:
    with pytest.raises(PolicyError) as refused:
        parse_without("finishing_order,fast_mode")
    assert "no rule named fast_mode" in str(refused.value) and all(rule in str(refused.value) for rule in RULES)


def test_the_ablation_compares_each_rule_off_with_all_on_and_lists_rules_that_change_nothing() -> None:
    """``ablate`` on made-up scores (what is checked is the bookkeeping, not a simulation)."""
    scores = {"m1": {"gpu_busy": 0.8, "settle_s": 2.0, "changes_per_job_minute": 1.0},
              "m2": {"gpu_busy": 0.5, "settle_s": 3.0, "changes_per_job_minute": 2.0}}

    def run(mix: str, rules: AdaptiveRules) -> dict[str, float]:
        result = dict(scores[mix])
        if "finishing_order" in rules.off and mix == "m2":
            result["gpu_busy"] = 0.45  # 10% less without it
        if "first_plan_bar" in rules.off and mix == "m1":
            result["settle_s"] = 1.0  # a step sooner: noise
        if "hysteresis" in rules.off and mix == "m1":
            result["gpu_busy"], result["settle_s"] = 0.82, 0.0  # better without it
        return result

    document = ablate(["m1", "m2"], ["finishing_order", "first_plan_bar", "hysteresis", "first_plan_bar+hysteresis"], run)
    pays = document["without"]["finishing_order"]["effect"]
    assert pays["gpu_busy_ratio_worst"] == pytest.approx(0.9) and pays["mixes_moved"] == {"m2": pytest.approx(0.9)}
    assert document["candidates_for_removal"] == ["first_plan_bar"]
    assert document["never_worse_without"] == ["first_plan_bar", "hysteresis", "first_plan_bar+hysteresis"]
    assert not document["without"]["first_plan_bar"]["effect"]["identical"]
    together = document["without"]["first_plan_bar+hysteresis"]["mixes"]["m1"]  # both off in one run
    assert together["gpu_busy"] == pytest.approx(0.82) and together["settle_s"] == 0.0
    assert effect(scores, scores)["identical"] and effect(scores, scores)["candidate_for_removal"]


def test_on_the_node_a_move_within_the_repeats_spread_is_no_effect() -> None:
    on = {"m": {"gpu_busy": 0.50, "settle_s": 3.0, "changes_per_job_minute": 2.0, "gpu_busy_spread": 0.03}}
    within = {"m": dict(on["m"], gpu_busy=0.51, gpu_busy_spread=0.01)}  # 2%: the repeats moved 3%
    beyond = {"m": dict(on["m"], gpu_busy=0.47, gpu_busy_spread=0.01)}  # 6%
    assert effect(on, within)["mixes_moved"] == {} and effect(on, within)["candidate_for_removal"]
    assert effect(on, beyond)["mixes_moved"] == {"m": pytest.approx(0.94)}


def test_the_node_ablation_reuses_a_finished_run_and_compares_other_policies(tmp_path: Path) -> None:
    """A run already in the workdir with every policy asked for is read, not run again (the mix
    file below does not exist: running it would fail), and ``--also`` policies are compared
    with adaptive from the same runs."""
    def policy(busy: list[float], jct: float) -> dict[str, object]:
        return {"gpu_busy": sorted(busy)[0], "settle_s": 1.0, "changes_per_job_minute": 2.0, "mean_jct_s": jct,
                "makespan_s": 60.0, "repeats": [{"gpu_busy": b} for b in busy]}

    arms = [AdaptiveRules().without(["hysteresis"])]
    (tmp_path / "m.json").write_text(json.dumps({"policies": {
        "adaptive": policy([0.50, 0.52], 40.0), "jct": policy([0.49, 0.50], 30.0),
        "adaptive~hysteresis": policy([0.40, 0.41], 40.0)}}))
    run, runs = node_runner({"m.json": tmp_path / "missing.json"}, arms, 2, tmp_path, also=["jct"], reuse=True)
    assert run("m.json", AdaptiveRules())["gpu_busy_spread"] == pytest.approx(0.02 / 0.51)
    assert run("m.json", arms[0])["gpu_busy"] == 0.40
    versus = compared(runs, ["jct"])["jct"]["m.json"]["vs_adaptive"]
    assert versus == {"gpu_busy": pytest.approx(0.98), "mean_jct_s": pytest.approx(0.75), "makespan_s": 1.0}
    missing_policy, _ = node_runner({"m.json": tmp_path / "missing.json"}, arms, 2, tmp_path, also=["oracle"],
                                    reuse=True)
    assert missing_policy("m.json", AdaptiveRules()) is None  # not reusable: run, and the missing mix fails


def test_the_node_ablation_interleaves_every_arm_in_one_adloader_bench_run(tmp_path: Path) -> None:
    """One ``adloader bench`` per mix runs adaptive and each arm as policies of their own, so the
    repeats alternate (A B C A B C); each arm's controller gets its rules as ``--without``."""
    arms = [AdaptiveRules().without(["finishing_order"]), AdaptiveRules().without(["safety_net", "hysteresis"])]
    command = node_command(Path("mix.json"), arms, 2, tmp_path / "out.json", ("--scale", "0.1"))
    assert command[1:] == ["-m", "adloader", "bench", "--mix", "mix.json", "--policies",
                           "adaptive,adaptive~finishing_order,adaptive~hysteresis+safety_net", "--repeats", "2",
                           "--json", str(tmp_path / "out.json"), "--scale", "0.1"]
    node = NodeSetup()
    for policy, without in (("adaptive", None), ("adaptive~hysteresis+safety_net", "hysteresis,safety_net"),
                            ("adaptive@with-loaders~finishing_order", "finishing_order")):
        name, training, rules_off = split_variant(policy)
        options = _controller_options(name, training, node, None, rules_off)
        assert options[options.index("--without") + 1] == without if without else "--without" not in options
    with pytest.raises(BenchError, match="no rule named fast_mode"):
        split_variant("adaptive~fast_mode")
    longest = "adaptive@with-loaders~" + "+".join(RULES)  # every rule off: the longest label
    socket = Path("/tmp/adloader-bench/crossing-pair-sharp") / f"{run_dir_name(longest)}-10" / "s.sock"
    assert len(str(socket)) < 108 and run_dir_name("adaptive") == "adaptive"


def test_bench_simulate_records_the_rules_it_ran_without(tmp_path: Path) -> None:
    """``python -m bench.simulate --mix ... --without``: the shipped mix under adaptive, every rule
    on and then without the finishing order (bench/mixes/jct_lengths.json: lengths 1:2:4:8,
    where the order decides)."""
    from bench.simulate import main

    mix = Path(__file__).resolve().parents[1] / "bench" / "mixes" / "jct_lengths.json"
    figures = {}
    for without in (None, "finishing_order"):
        out = tmp_path / f"{without}.json"
        assert main(["--mix", str(mix), "--policies", "adaptive", "--seeds", "1", "--json", str(out),
                     *(["--without", without] if without else [])]) == 0
        figures[without] = json.loads(out.read_text())["mixes"][0]["policies"]["adaptive"]
    assert figures[None] != figures["finishing_order"]

