"""A job's length learnt from the node's history of recurring jobs (throughput_model/lengths.py,
controller/remaining.py): the forest's interval, ranking by its pessimistic end where it is
wide, the fallbacks, its error leaving each job's own runs out, and the controller's recall of
a length for a job that never completed here."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.history import FinishedJob, JobHistory
from controller.node_memory import NodeMemory
from controller.remaining import main
from throughput_model.lengths import (
    LengthForest, LengthPrediction, LengthRecord, leave_own_out_error, ranking_length, recurring_history,
)


def test_a_job_is_ranked_by_the_prediction_its_long_end_where_uncertain_then_declared_then_unknown() -> None:
    sure = LengthPrediction(samples=1000.0, low=900.0, high=1200.0)
    unsure = LengthPrediction(samples=1000.0, low=300.0, high=5000.0)
    assert not sure.uncertain and unsure.uncertain
    assert ranking_length(sure, 400.0) == (1000.0, "history")
    assert ranking_length(unsure, 400.0) == (5000.0, "history, pessimistic end")
    assert ranking_length(None, 400.0) == (400.0, "declared")
    assert ranking_length(None, None) == (None, "unknown")


def test_lengths_are_learnt_from_other_jobs_of_the_same_kind() -> None:
    history = recurring_history(seed=3, families=12, runs_per_family=3)
    figures = leave_own_out_error(history)
    assert figures["runs"] >= 30  # nearly every job had others to learn from
    assert figures["median_error"] < 0.6
    # ranked by the long end where uncertain: more often not short than the point alone
    assert figures["ranked_not_short"] >= 0.5
    forest = LengthForest(history)
    family = history[0]
    prediction = forest.predict(LengthRecord(name=family.name, gpus=family.gpus, batch_size=family.batch_size,
                                             features=family.features))
    assert prediction.low <= prediction.samples <= prediction.high
    assert prediction.samples == pytest.approx(family.samples, rel=0.3)  # its own runs are in this forest


def test_a_declaring_job_is_predicted_as_the_fraction_of_its_declared_length_its_kind_trains() -> None:
    # fine-tunes declare a budget and stop early, at 30-60% of it; pretraining runs it out
    history = recurring_history(seed=1)
    figures = leave_own_out_error(history)
    assert figures["declaring_runs"] >= 40
    # learnt from the other jobs, the fraction beats the declared length taken as it is
    assert figures["declaring_median_error"] < figures["declared_median_error"]
    assert figures["declaring_p90_error"] < figures["declared_p90_error"]
    fractions = LengthForest(history, of_declared=True)
    finetune = next(r for r in history if "finetune" in r.name)
    # declared ten times longer than anything seen, it is still predicted as that fraction of it
    larger = LengthRecord(name=finetune.name, gpus=finetune.gpus, batch_size=finetune.batch_size,
                          features=finetune.features, declared=10 * (finetune.declared or 0.0))
    prediction = fractions.predict(larger)
    assert 0.25 * larger.declared <= prediction.samples <= 0.65 * larger.declared  # type: ignore[operator]
    with pytest.raises(ValueError, match="declares no length"):
        fractions.predict(LengthRecord(name="eval-x", gpus=1))


def test_too_short_a_history_learns_nothing() -> None:
    with pytest.raises(ValueError, match="at least"):
        LengthForest(recurring_history(families=1, runs_per_family=3))


def _record(history: JobHistory, run: LengthRecord, index: int, exit_code: int = 0) -> None:
    history.record(FinishedJob(job_id=f"j{index}", name=run.name, gpus=run.gpus, samples=int(run.samples or 0),
                               duration_s=60.0, finished_at=1000.0 + index, features=dict(run.features),
                               batch_size=run.batch_size, exit_code=exit_code,
                               declared_samples=int(run.declared) if run.declared else None))


def test_the_controller_recalls_a_learnt_length_for_a_job_that_never_completed_here(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    memory = NodeMemory(tmp_path, "cpu")
    history = memory.history
    assert history is not None
    runs = recurring_history(seed=5, families=8, runs_per_family=3)
    for index, run in enumerate(runs):
        _record(history, run, index)
    _record(history, LengthRecord(name="never-done", gpus=1, samples=7.0), len(runs), exit_code=1)  # not a length
    assert len(history.completed_runs()) == len(runs)
    # a newcomer named and shaped like a known family: its length from the others' runs
    known = runs[0]
    newcomer = f"{known.name.rsplit('-', 1)[0]}-99"
    recollection = memory.recall(newcomer, dict(known.features))
    assert recollection is not None and recollection.samples is not None
    lengths = sorted(r.samples for r in runs if r.samples)
    assert lengths[0] <= recollection.samples <= lengths[-1] * 2
    # a job that ran here before: the forest, which learnt from its runs too, predicts it near them
    own = memory.recall(known.name, dict(known.features))
    assert own is not None and own.samples == pytest.approx(
        sorted(r.samples for r in runs if r.name == known.name)[1], rel=0.3)
    # a declared length: predicted as the fraction of it that runs of its kind trained
    if known.declared:
        declaring = memory.recall(known.name, dict(known.features), int(known.declared))
        assert declaring is not None and declaring.samples == pytest.approx(known.samples, rel=0.3)
    assert main(["--history", str(memory.path)]) == 0
    assert "median error" in capsys.readouterr().out
