"""Judge the model on architectures it never saw: leave one family out.

For each family, the model is fitted on the other families and predicts every point
of the held-out one. Next to it, on the same points:

- roofline: the analytic roofline from FLOPs and bytes alone (no fitted term);
- prior: the untuned physical prior (roofline + per-op cost), what GPUs get;
- ernest: an Ernest-style fit (NNLS, step = t0 + t1 * batch) on the same architecture's
  other measured batch sizes: it has seen the job run, ours has not seen the family.

Reported per family and pooled: mean and p90 absolute percentage error of the step
time, the signed bias (mean of (predicted - measured)/measured), Spearman rank
correlation across jobs, the coverage of the prediction interval (computed only from
the training families), and the online correction after 20 measured steps (replayed
on the profiled step samples; truth = the median of the later samples).

Beside them, the noise floor of the same profile run: per point, how far the median of the
first half of its timed steps lies from the median of the second half (the two halves are
separated by the instrumented steps). No predictor can be judged finer than its truth repeats.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from typing import Mapping

import numpy as np
from scipy.optimize import nnls
from scipy.stats import spearmanr

from throughput_model.fit import corpus_device, fit, points_of, prior_seconds, roofline_seconds
from throughput_model.online import OnlineCorrection

METHODS = ("model", "prior", "roofline", "ernest")
ONLINE_STEPS = 20
GOALS = {"mean_ape": 0.12, "p90_ape": 0.25, "worst_family_mean_ape": 0.25, "spearman": 0.95, "roofline_ratio": 2.0,
         "online_mean_ape": 0.05}


def ernest_predictions(points: list[dict]) -> list[float | None]:
    """Per point, NNLS of step = t0 + t1 * batch on the other batch sizes of its architecture."""
    by_model: dict[str, list[int]] = defaultdict(list)
    for index, p in enumerate(points):
        by_model[p["model"]].append(index)
    predictions: list[float | None] = [None] * len(points)
    for indices in by_model.values():
        for i in indices:
            others = [j for j in indices if j != i]
            if len(others) < 2:
                continue
            A = np.array([[1.0, points[j]["batch"]] for j in others])
            b = np.array([points[j]["step_s"] for j in others])
            theta, _ = nnls(A, b)
            predictions[i] = float(theta[0] + theta[1] * points[i]["batch"])
    return predictions


def metrics(predicted: list[float], measured: list[float]) -> dict[str, float]:
    pred, true = np.array(predicted), np.array(measured)
    relative = (pred - true) / true
    ape = np.abs(relative)
    rho = spearmanr(pred, true).statistic if len(true) > 2 else float("nan")
    return {
        "n": int(len(true)),
        "mean_ape": float(ape.mean()),
        "p90_ape": float(np.quantile(ape, 0.9)),
        "bias": float(relative.mean()),
        "spearman": float(rho),
    }


def split_half_noise(samples: list[float]) -> float | None:
    """|median(first half) / median(second half) - 1| of one point's timed steps, or None for fewer
    than 4 samples: how well the measured step time repeats within its own run."""
    if len(samples) < 4:
        return None
    half = len(samples) // 2
    return abs(statistics.median(samples[:half]) / statistics.median(samples[half:]) - 1.0)


def online_errors(predicted_step_s: float, log_sigma: float, samples: list[float],
                  steps: int = ONLINE_STEPS) -> tuple[float, float, float] | None:
    """After ``steps`` measured steps: the error of the corrected estimate and of the plain median
    of those steps against the median of the later steps, and the corrected estimate's error
    against the whole run's median. None when a point has too few samples."""
    if len(samples) < steps + 5:
        return None
    correction = OnlineCorrection(predicted_step_s, log_sigma)
    for sample in samples[:steps]:
        correction.observe(sample)
    later, whole = statistics.median(samples[steps:]), statistics.median(samples)
    estimate = correction.step_seconds()
    return (abs(estimate - later) / later, abs(statistics.median(samples[:steps]) - later) / later,
            abs(estimate - whole) / whole)


def evaluate(corpus: Mapping) -> dict:
    """Leave-one-family-out evaluation of the model and the baselines on ``corpus``."""
    device = corpus_device(corpus)
    points = points_of(corpus)
    started = time.perf_counter()
    fit(points, device)
    fit_seconds = time.perf_counter() - started
    families = list(dict.fromkeys(p["family"] for p in points))
    ernest = ernest_predictions(points)
    rows: dict[str, dict[str, list[float]]] = {f: defaultdict(list) for f in families}
    covered: dict[str, list[bool]] = defaultdict(list)
    noise: dict[str, list[float]] = defaultdict(list)
    online: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for family in families:
        train = [p for p in points if p["family"] != family]
        model = fit(train, device)  # its interval comes from leaving out families of ``train`` only
        low, high = model.log_interval
        sigma = max((high - low) / (2 * 1.645), 0.05)
        for index, p in enumerate(points):
            if p["family"] != family:
                continue
            predicted = model.step_seconds(p["features"])
            row = rows[family]
            row["measured"].append(p["step_s"])
            row["model"].append(predicted)
            row["prior"].append(prior_seconds(p["features"], device))
            row["roofline"].append(roofline_seconds(p["features"], device))
            row["ernest"].append(ernest[index] if ernest[index] is not None else float("nan"))
            covered[family].append(predicted * math.exp(low) <= p["step_s"] <= predicted * math.exp(high))
            repeat = split_half_noise(p.get("step_samples_s", []))
            if repeat is not None:
                noise[family].append(repeat)
            errors = online_errors(predicted, sigma, p.get("step_samples_s", []))
            if errors is not None:
                online[family].append(errors)
    per_family = {f: _summarise(rows[f], covered[f], online[f], noise[f]) for f in families}
    pooled_rows: dict[str, list[float]] = defaultdict(list)
    for f in families:
        for key, values in rows[f].items():
            pooled_rows[key] += values
    pooled = _summarise(pooled_rows, [c for f in families for c in covered[f]], [e for f in families for e in online[f]],
                        [n for f in families for n in noise[f]])
    return {
        "label": "CPU-proxy" if device.kind == "cpu" else f"GPU ({device.name})",
        "device": corpus["device"].get("source", ""),
        "device_numbers": corpus.get("device_numbers"),
        "corpus_created": corpus.get("created"),
        "corpus_loadavg": [corpus.get("loadavg_before"), corpus.get("loadavg_after")],
        "points": len(points),
        "families": families,
        "per_family": per_family,
        "pooled": pooled,
        "fit_seconds": fit_seconds,
        "goals": GOALS,
        "goals_met": _goals_met(pooled, per_family),
    }


def _summarise(row: Mapping[str, list[float]], covered: list[bool], online: list[tuple[float, float, float]],
               noise: list[float]) -> dict:
    measured = row["measured"]
    result = {m: metrics(row[m], measured) for m in ("model", "prior", "roofline")}
    result["noise_floor"] = {"n": len(noise), "mean_ape": float(np.mean(noise)),
                             "p90_ape": float(np.quantile(noise, 0.9))} if noise else None
    pairs = [(e, t) for e, t in zip(row["ernest"], measured) if not math.isnan(e)]
    result["ernest"] = metrics([e for e, _ in pairs], [t for _, t in pairs]) if len(pairs) > 2 else None
    result["roofline_ratio"] = result["roofline"]["mean_ape"] / max(result["model"]["mean_ape"], 1e-12)
    result["interval_coverage"] = float(np.mean(covered)) if covered else float("nan")
    if online:
        corrected, raw, whole = (np.array([o[i] for o in online]) for i in range(3))
        result["online"] = {"n": len(online), "steps": ONLINE_STEPS, "mean_ape": float(corrected.mean()),
                            "p90_ape": float(np.quantile(corrected, 0.9)), "measured_only_mean_ape": float(raw.mean()),
                            "whole_run_mean_ape": float(whole.mean())}
    return result


def _goals_met(pooled: Mapping, per_family: Mapping[str, Mapping]) -> dict[str, bool]:
    model = pooled["model"]
    worst = max(summary["model"]["mean_ape"] for summary in per_family.values())
    return {
        "mean_ape": model["mean_ape"] <= GOALS["mean_ape"],
        "p90_ape": model["p90_ape"] <= GOALS["p90_ape"],
        "worst_family_mean_ape": worst <= GOALS["worst_family_mean_ape"],
        "spearman": model["spearman"] >= GOALS["spearman"],
        "roofline_ratio": pooled["roofline_ratio"] >= GOALS["roofline_ratio"],
        "online_mean_ape": "online" in pooled and pooled["online"]["mean_ape"] <= GOALS["online_mean_ape"],
    }


def markdown(result: Mapping) -> str:
    """The held-out table, as Markdown (printed by ``adloader model evaluate``)."""
    lines = [
        f"Leave-one-family-out evaluation, {result['label']} ({result['device']}); "
        f"{result['points']} points, step time (forward + backward + optimizer), thread CPU time.",
        "",
        "| held-out family | n | model mean / p90 APE | bias | Spearman | prior mean APE | roofline mean APE "
        "| roofline / model | Ernest mean APE | interval cover | online@20 mean APE | noise floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, summary in [*result["per_family"].items(), ("**all (pooled)**", result["pooled"])]:
        model, ernest, online = summary["model"], summary["ernest"], summary.get("online")
        lines.append(
            f"| {name} | {model['n']} | {model['mean_ape']:.1%} / {model['p90_ape']:.1%} | {model['bias']:+.1%} "
            f"| {model['spearman']:.3f} | {summary['prior']['mean_ape']:.1%} | {summary['roofline']['mean_ape']:.1%} "
            f"| {summary['roofline_ratio']:.1f}x | {_percent(ernest)} | {summary['interval_coverage']:.0%} "
            f"| {_percent(online)} | {_percent(summary.get('noise_floor'))} |"
        )
    pooled = result["pooled"]
    lines += ["", "Pooled over all held-out predictions:", "",
              "| method | mean APE | p90 APE | bias | Spearman |", "| --- | ---: | ---: | ---: | ---: |"]
    labels = {"model": "model (family never seen)", "prior": "physical prior, untuned (what GPUs get)",
              "roofline": "analytic roofline (FLOPs and bytes alone)",
              "ernest": "Ernest-style, fitted on the same architecture's other batch sizes"}
    for method in METHODS:
        summary = pooled[method]
        if summary is not None:
            lines.append(f"| {labels[method]} | {summary['mean_ape']:.1%} | {summary['p90_ape']:.1%} "
                         f"| {summary['bias']:+.1%} | {summary['spearman']:.3f} |")
    goals, online = result["goals_met"], pooled.get("online")
    verdict = {True: "met", False: "MISSED"}
    worst_name, worst = max(((f, s["model"]["mean_ape"]) for f, s in result["per_family"].items()), key=lambda x: x[1])
    lines += ["", "Goals (CPU-proxy): " + "; ".join([
        f"mean APE <= {GOALS['mean_ape']:.0%}: {verdict[goals['mean_ape']]}",
        f"p90 APE <= {GOALS['p90_ape']:.0%}: {verdict[goals['p90_ape']]}",
        f"no family worse than {GOALS['worst_family_mean_ape']:.0%}: {verdict[goals['worst_family_mean_ape']]} "
        f"(worst: {worst_name} {worst:.1%})",
        f"Spearman >= {GOALS['spearman']}: {verdict[goals['spearman']]}",
        f">= 2x lower error than the roofline: {verdict[goals['roofline_ratio']]} ({pooled['roofline_ratio']:.1f}x)",
        f"online after {ONLINE_STEPS} steps <= 5%: {verdict[goals['online_mean_ape']]}",
    ])]
    if pooled.get("noise_floor"):
        lines.append(f"Noise floor of this profile run: the medians of each point's two halves of timed steps differ "
                     f"by {pooled['noise_floor']['mean_ape']:.1%} on average (p90 {pooled['noise_floor']['p90_ape']:.1%}).")
    if online:
        lines.append(
            f"Online: after {ONLINE_STEPS} measured steps the corrected estimate is {online['mean_ape']:.1%} "
            f"(p90 {online['p90_ape']:.1%}) from the median of the later, unseen steps of the same run; the median "
            f"of the {ONLINE_STEPS} steps alone is {online['measured_only_mean_ape']:.1%} from it (the run-to-run "
            f"noise of this shared machine); against the whole run's median the corrected estimate is "
            f"{online['whole_run_mean_ape']:.1%}.")
    lines.append(f"Fitting the model on the whole corpus (with its held-out interval) took "
                 f"{result['fit_seconds'] * 1e3:.0f} ms.")
    return "\n".join(lines)


def _percent(summary: Mapping | None) -> str:
    return f"{summary['mean_ape']:.1%}" if summary else "-"
