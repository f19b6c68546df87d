"""The throughput model judged on architectures nobody here picked: a public set chosen by rule.

The zoo's families were chosen in this project, and features were added after seeing which
missed; its leave-one-family-out error says little about a model nobody has seen. This set
comes from Hugging Face ``transformers`` instead, by a rule written down before anything was
measured (docs/prediction.md, "The public evaluation set"):

1. Families, in this order: vision (``MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES``), audio
   (``..._AUDIO_CLASSIFICATION_...``), seq2seq (``..._SEQ_TO_SEQ_CAUSAL_LM_...``), decoder
   (``..._CAUSAL_LM_...``), text classifier (``..._SEQUENCE_CLASSIFICATION_...``). A model type
   belongs to the first family whose mapping lists it.
2. Each family's model types, sorted by name, shuffled with ``random.Random(SEED)`` (seed 0).
3. Each candidate's default config (``AutoConfig.for_model``, no download) is shrunk by
   :func:`shrink` (fixed caps on layers, heads, widths, vocabulary, image and audio sizes); the
   model is built from it, and taken if one training step (forward, loss, backward, AdamW step)
   runs on this CPU. Walk the order until :data:`PER_FAMILY` are taken or it ends.
4. Nothing is dropped after measuring, and nothing measured here informs the model: predictions
   come from the model fitted on the shipped zoo corpus only.

Measurement is the corpus's: one thread, thread CPU time, median of the timed steps. The
device is calibrated over the same window as the steps: before each timed step and after the
last, and the architecture is predicted with the median of each number. The machine's drift
(20 % within an hour here) cancels, and so does a VM that switches speed within seconds, which a
calibration before and after the steps catches at one speed while the steps' median averages
over both. How far apart an architecture's calibrations are is kept with its row
(``calibrations_apart``). The error is of throughput (samples/s): predicted / measured - 1.

``python -m throughput_model.public_eval --out bench/results/public_eval.json``
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from throughput_model.errors import ThroughputModelError

log = logging.getLogger(__name__)

FAMILIES: tuple[tuple[str, str], ...] = (
    ("vision", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("audio", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
    ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("decoder", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("text-classifier", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
)
SEED = 0
PER_FAMILY = 10
BATCH = 8
SEQUENCE = 64
AUDIO_SAMPLES = 16000
STEPS = 10
WARMUP = 2
GOALS = {"median_ape": 0.10, "p90_ape": 0.25}

CAPS: dict[str, tuple[frozenset[str], int]] = {
    "layers": (frozenset({"num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                          "num_encoder_layers", "num_decoder_layers"}), 2),
    "heads": (frozenset({"num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                         "decoder_attention_heads", "num_key_value_heads", "num_kv_heads"}), 4),
    "width": (frozenset({"hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim"}), 128),
    "head_dim": (frozenset({"head_dim", "d_kv"}), 32),
    "ffn": (frozenset({"intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "ffn_dim", "d_ff",
                       "moe_intermediate_size", "shared_expert_intermediate_size"}), 256),
    "vocab": (frozenset({"vocab_size"}), 2048),
    "experts": (frozenset({"num_experts", "num_local_experts", "n_routed_experts"}), 4),
    "experts_per_token": (frozenset({"num_experts_per_tok"}), 2),
    "sequence": (frozenset({"max_source_positions", "max_length"}), 256),
    "list_width": (frozenset({"hidden_sizes", "embed_dims", "conv_dim", "dims", "neck_hidden_sizes"}), 128),
    "list_depth": (frozenset({"depths"}), 2),
}
"""The shrinking rule: every attribute of a config (and of its sub-configs) named in a group is
capped at the group's value (list attributes element by element); ``image_size`` becomes 64.
Token ids beyond the shrunk vocabulary become its last id."""
IMAGE_SIZE = 64


class PublicEvalError(ThroughputModelError):
    """The public evaluation cannot run (``transformers`` missing, nothing buildable)."""


@dataclass(frozen=True)
class Candidate:
    family: str
    model_type: str
    class_name: str


def transformers_module() -> Any:
    """``transformers``, offline (nothing may download at run time)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise PublicEvalError(f"the public evaluation needs Hugging Face transformers ({exc}); install it with "
                              "torch pinned: python3 -m pip install -c <(echo torch==$(python3 -c "
                              "'import torch; print(torch.__version__)')) transformers") from None
    transformers.logging.set_verbosity_error()
    return transformers


def parse_families(text: str | None) -> tuple[str, ...] | None:
    """``--families``' comma-separated names, checked against :data:`FAMILIES`; None: all."""
    if not text:
        return None
    families = tuple(text.split(","))
    known = [f for f, _ in FAMILIES]
    if not set(families) <= set(known):
        raise PublicEvalError(f"unknown family in --families: {sorted(set(families) - set(known))}; known: {known}")
    return families


def candidates(families: tuple[str, ...] | None = None) -> list[Candidate]:
    """Every candidate in rule order (steps 1 and 2 of the module docstring)."""
    transformers_module()
    from transformers.models.auto import modeling_auto

    taken: set[str] = set()
    ordered: list[Candidate] = []
    for family, mapping_name in FAMILIES:
        mapping = getattr(modeling_auto, mapping_name)
        types = sorted(t for t in mapping if t not in taken)
        taken.update(types)
        random.Random(SEED).shuffle(types)
        if families is None or family in families:
            ordered += [Candidate(family, t, mapping[t]) for t in types]
    return ordered


def shrink(config: Any) -> Any:
    """Apply :data:`CAPS` to ``config`` and its sub-configs, in place; returns it."""
    transformers = transformers_module()
    base = transformers.PretrainedConfig
    for name, value in list(vars(config).items()):
        if isinstance(value, base):
            shrink(value)
        elif name == "image_size" and isinstance(value, (int, list, tuple)):
            setattr(config, name, IMAGE_SIZE if isinstance(value, int) else [IMAGE_SIZE] * len(value))
        elif isinstance(value, bool):
            continue
        else:
            for names, cap in CAPS.values():
                if name not in names:
                    continue
                if isinstance(value, int):
                    setattr(config, name, min(value, cap))
                elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
                    setattr(config, name, [min(v, cap) for v in value])
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        for name, value in list(vars(config).items()):
            if name.endswith("_token_id") and isinstance(value, int) and value >= vocab:
                setattr(config, name, vocab - 1)
    return config


def build(candidate: Candidate) -> tuple[Any, dict[str, Any]]:
    """The shrunk model (training mode, seed 0) and an example batch of :data:`BATCH` samples."""
    import torch

    transformers = transformers_module()
    config = shrink(transformers.AutoConfig.for_model(candidate.model_type))
    torch.manual_seed(0)
    model = getattr(transformers, candidate.class_name)(config).train()
    return model, example_batch(model, config)


def example_batch(model: Any, config: Any) -> dict[str, Any]:
    """Inputs for the model's main input (token ids, pixels, raw audio or spectrogram features)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    name = getattr(model, "main_input_name", "input_ids")
    text = getattr(config, "get_text_config", lambda **_: config)(decoder=True)
    vocab = int(getattr(text, "vocab_size", None) or 1000)
    if name == "input_ids":
        batch = {"input_ids": torch.randint(3, max(4, vocab), (BATCH, SEQUENCE), generator=generator)}
        if getattr(config, "is_encoder_decoder", False):
            batch["decoder_input_ids"] = torch.randint(3, max(4, vocab), (BATCH, SEQUENCE // 2), generator=generator)
        return batch
    if name == "pixel_values":
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", IMAGE_SIZE)
        height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
        return {name: torch.randn(BATCH, getattr(vision, "num_channels", 3), height, width, generator=generator)}
    if name == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 80)
        frames = 2 * getattr(config, "max_source_positions", 64)
        batch = {name: torch.randn(BATCH, bins, frames, generator=generator)}
        if getattr(config, "is_encoder_decoder", False):
            batch["decoder_input_ids"] = torch.randint(3, max(4, vocab), (BATCH, SEQUENCE // 2), generator=generator)
        return batch
    if name == "input_values" and getattr(config, "num_mel_bins", None) and getattr(config, "max_length", None):
        return {name: torch.randn(BATCH, config.max_length, config.num_mel_bins, generator=generator)}
    return {name: torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)}


def logits_loss(output: Any) -> Any:
    """Cross-entropy of the model's logits against class 0 (what a real classification or LM loss costs)."""
    from throughput_model.zoo import classification_loss

    logits = output.logits if hasattr(output, "logits") else output[0]
    return classification_loss(logits.float())


def measure(model: Any, batch: dict[str, Any], steps: int, warmup: int,
            calibrate: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Median thread CPU seconds of a training step (forward, loss, backward, AdamW), the optimizer
    used, and ``calibrate()``'s results from before each timed step and after the last. Each
    calibration is followed by one untimed step: its 96 MiB memory stream evicts the caches, and a 10 ms
    step run right after one took 25 % longer."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        start = time.thread_time()
        logits_loss(model(**batch)).backward()
        optimizer.step()
        return time.thread_time() - start

    for _ in range(warmup):
        step()
    samples: list[float] = []
    calibrations = []
    for _ in range(steps):
        if calibrate is not None:
            calibrations.append(calibrate())
            step()
        samples.append(step())
    if calibrate is not None:
        calibrations.append(calibrate())
    return {"step_s": statistics.median(samples), "step_samples_s": [round(s, 6) for s in samples],
            "optimizer": optimizer, "calibrations": calibrations}


def run(per_family: int = PER_FAMILY, families: tuple[str, ...] | None = None, max_total: int | None = None,
        steps: int = STEPS, warmup: int = WARMUP, threads: int = 1,
        calibrate: Callable[[int], dict[str, float]] | None = None, corpus: Path | None = None) -> dict[str, Any]:
    """Select (by the rule), measure and predict with the model fitted on ``corpus`` (a zoo corpus:
    the shipped one, or one profiled on this host by ``adloader model profile``); the JSON document."""
    import torch

    from throughput_model.corpus import cpu_model_name
    from throughput_model.devices import calibration, cpu_device, measure_cpu_numbers, median_numbers
    from throughput_model.features import describe
    from throughput_model.fit import load_fitted

    calibrate = calibrate or measure_cpu_numbers
    fitted = load_fitted(corpus)  # a zoo corpus only
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    started = time.time()
    taken: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    calibrations: list[dict[str, Any]] = []
    try:
        for candidate in candidates(families):
            if taken.get(candidate.family, 0) >= per_family or (max_total is not None and len(rows) >= max_total):
                continue
            try:
                model, batch = build(candidate)
                measured = measure(model, batch, steps, warmup, lambda: calibration(threads, calibrate))
            except Exception as exc:  # the rule: a candidate that does not build or train is not taken
                first_line = str(exc).splitlines()[0][:200] if str(exc) else ""
                skipped.append({"family": candidate.family, "model_type": candidate.model_type,
                                "reason": f"{type(exc).__name__}: {first_line}"})
                continue
            description = describe(model, batch, loss_fn=logits_loss, optimizer=measured.pop("optimizer"))
            window = measured.pop("calibrations")
            calibrations += window
            numbers = median_numbers(window)
            predicted = _predicted_step_s(fitted, description.features, cpu_device(numbers, threads, cpu_model_name()))
            rows.append({**asdict(candidate), "params": int(description.features["params"]),
                         "count_complete": description.features["count_complete"], "notes": list(description.notes),
                         **measured, "predicted_step_s": predicted if predicted > 0 else None,
                         # predicted samples/s over measured, - 1; None: the model could not predict it
                         "error": measured["step_s"] / predicted - 1.0 if predicted > 0 else None,
                         "in_interval": (predicted * math.exp(fitted.log_interval[0]) <= measured["step_s"]
                                         <= predicted * math.exp(fitted.log_interval[1])),
                         # the largest ratio of one device number among the architecture's calibrations
                         "calibrations_apart": round(max(max(c["numbers"][k] for c in window)
                                                         / min(c["numbers"][k] for c in window) for k in numbers), 4)})
            taken[candidate.family] = taken.get(candidate.family, 0) + 1
            log.info("%s %s: measured %.1f ms, predicted %.1f ms (calibrations %.2fx apart)", candidate.family,
                     candidate.model_type, measured["step_s"] * 1e3, predicted * 1e3, rows[-1]["calibrations_apart"])
            del model, batch
    finally:
        torch.set_num_threads(previous)
    if not rows:
        raise PublicEvalError(f"no architecture built and trained ({len(skipped)} skipped); see 'skipped'")
    import transformers

    return {
        "benchmark": "throughput model on a public set chosen by rule (Hugging Face transformers, CPU-proxy)",
        "rule": {"families": [f for f, _ in FAMILIES], "seed": SEED, "per_family": per_family,
                 "caps": {k: [sorted(v[0]), v[1]] for k, v in CAPS.items()}, "image_size": IMAGE_SIZE,
                 "batch": BATCH, "sequence": SEQUENCE, "audio_samples": AUDIO_SAMPLES},
        "transformers": transformers.__version__, "torch": torch.__version__, "threads": threads,
        "corpus": {"path": str(corpus) if corpus else "shipped", "cpu_model": fitted.device.source},
        "steps": steps, "warmup": warmup, "cpu_model": cpu_model_name(),
        "corpus_device_numbers": dict(zip(("peak_flops", "memory_bandwidth", "op_overhead_s"),
                                          (fitted.device.peak_flops, fitted.device.memory_bandwidth,
                                           fitted.device.op_overhead_s))),
        "calibrations": calibrations,
        "wall_s": round(time.time() - started, 1),
        "architectures": rows,
        "skipped": skipped,
        "summary": summarise(rows),
        **by_rank(rows),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _predicted_step_s(fitted: Any, features: dict[str, float], device: Any) -> float:
    """The fitted model's step time, 0 where the product would not predict (predict.require_work)."""
    from throughput_model.predict import InsufficientFeatures, require_work

    try:
        require_work(features)
    except InsufficientFeatures:
        return 0.0
    return fitted.step_seconds(features, device)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, p90 and worst absolute throughput error, overall and per family, and the goals. An
    architecture the model could not predict at all (nothing counted) counts as a 100 % error."""
    def stats(chosen: list[dict[str, Any]]) -> dict[str, Any]:
        errors = [r["error"] if r["error"] is not None else -1.0 for r in chosen]
        absolute = np.abs(errors)
        return {"n": len(errors), "median_ape": float(np.median(absolute)),
                "p90_ape": float(np.quantile(absolute, 0.9)),
                "worst_ape": float(absolute.max()), "bias": float(np.median(errors)),
                "interval_coverage": float(np.mean([r["in_interval"] for r in chosen])),
                "unpredicted": sum(r["error"] is None for r in chosen)}

    overall = stats(rows)
    by_family = {f: stats([r for r in rows if r["family"] == f]) for f in dict.fromkeys(r["family"] for r in rows)}
    worst = max(rows, key=lambda r: abs(r["error"]) if r["error"] is not None else 1.0)
    return {**overall, "worst": f"{worst['family']}/{worst['model_type']}", "by_family": by_family,
            "goals": GOALS, "goals_met": {k: overall[k] <= v for k, v in GOALS.items()}}


def by_rank(rows: list[dict[str, Any]], set_size: int = PER_FAMILY) -> dict[str, Any]:
    """Where the walk went past the set (``--per-family`` above :data:`PER_FAMILY`): the set's figures
    (the first ``set_size`` taken per family) and those of the architectures after them, which the
    set's readers have not seen; nothing when it did not."""
    taken: dict[str, int] = {}
    ranks = []
    for row in rows:  # rows are in walk order
        taken[row["family"]] = taken.get(row["family"], 0) + 1
        ranks.append(taken[row["family"]])
    beyond = [r for r, rank in zip(rows, ranks) if rank > set_size]
    if not beyond:
        return {}
    return {"summary_the_set": summarise([r for r, rank in zip(rows, ranks) if rank <= set_size]),
            "summary_beyond_the_set": summarise(beyond)}


def markdown(document: dict[str, Any]) -> str:
    """The figures as the Markdown table docs/prediction.md shows."""
    summary = document["summary"]
    named = [*summary["by_family"].items(), ("**all**", summary)]
    named += [(name, document[key]) for name, key in ((f"the set: the first {PER_FAMILY} per family", "summary_the_set"),
                                                      ("beyond the set, never seen", "summary_beyond_the_set"))
              if key in document]
    lines = ["| family | n | median error | p90 error | worst | median signed | interval cover |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} | {s['n']} | {s['median_ape']:.1%} | {s['p90_ape']:.1%} | {s['worst_ape']:.1%} "
              f"| {s['bias']:+.1%} | {s['interval_coverage']:.0%} |" for name, s in named]
    met = summary["goals_met"]
    lines.append(f"\nGoals: median <= 10%: {'met' if met['median_ape'] else 'MISSED'}; p90 <= 25%: "
                 f"{'met' if met['p90_ape'] else 'MISSED'}. Worst: {summary['worst']}. "
                 f"{len(document['architectures'])} architectures taken, {len(document['skipped'])} "
                 "skipped by the rule.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m throughput_model.public_eval", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON document to write")
    parser.add_argument("--per-family", type=int, default=PER_FAMILY, help="architectures taken per family (above "
                        f"{PER_FAMILY}, the set's and the rest's figures are also given apart)")
    parser.add_argument("--families", help=f"comma-separated subset of {','.join(f for f, _ in FAMILIES)}")
    parser.add_argument("--max-architectures", type=int, help="stop after this many (dry runs)")
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps per architecture")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the corpus was profiled at 1)")
    parser.add_argument("--corpus", type=Path, help="zoo corpus to fit on (default: the shipped one; "
                                                    "'adloader model profile' makes one for this host)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        families = parse_families(args.families)
    except PublicEvalError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        document = run(args.per_family, families, args.max_architectures, args.steps, args.warmup, args.threads,
                       corpus=args.corpus)
    except ThroughputModelError as exc:  # no transformers, nothing buildable, an unreadable --corpus
        print(str(exc), file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(markdown(document))
    print(f"wrote {args.out} ({document['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
