"""The loop's rollout seam: an objective that samples from the model before it scores, and
reports figures of its own (tests/helpers/rollout_objective.py), on the tiny model."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests.helpers.rollout_objective import MAX_NEW_TOKENS, registered
from tests.helpers.tiny import next_attempt, stage_job
from tuneforge import methods
from tuneforge.demo.dataset import demo_examples
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.metrics import metrics_data
from tuneforge.storage import layout
from tuneforge.train.objective import TokenObjective, load_token_examples
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.rollout import step_generator
from tuneforge.train.runner import run_attempt

# 12 examples in steps of 4, two micro-batches each: 6 steps; a checkpoint (and validation) every 2
# steps and at the end of each epoch: steps 2, 3, 4 and 6
OPTIONS = {
    "hyperparameters": {"n_epochs": 2, "batch_size": 4, "micro_batch_size": 2, "learning_rate": 1e-3},
    "lora": {"dropout": 0.1},  # the global RNG matters too: dropout draws from it while training
    "checkpoint": {"every_steps": 2, "keep_last": 5},
}
STEPS = 6
OWN = ("rollout_mean_length", "reward_mean")


@dataclass
class Finished:
    reporter: RecordingReporter
    store: Any
    spec: Any
    objectives: list[Any]


def _stage(root: Path, model_dir: Path, **changes: Any) -> tuple[Any, Any]:
    spec, store = stage_job(root, model_dir, validation=demo_examples(n_keys=12)[:4], **OPTIONS, **changes)
    return replace(spec, method="rollout"), store


def _adapter(store: Any, spec: Any) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    return safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))


def _per_step(reporter: RecordingReporter) -> dict[int, tuple[float, ...]]:
    """Step -> (train loss, the objective's figures) of every metrics event."""
    return {e["data"]["step"]: (e["data"]["train_loss"], *(e["data"][name] for name in OWN))
            for e in reporter.events("metrics")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Finished:
    """An uninterrupted run of the generating objective."""
    spec, store = _stage(tmp_path_factory.mktemp("rollout-reference"), tiny_model_dir)
    reporter = RecordingReporter()
    with registered() as built:
        assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS
    return Finished(reporter, store, spec, built)


def test_the_hook_runs_once_a_step_with_the_model_in_eval_mode_and_training_resumes(reference: Finished) -> None:
    [objective] = reference.objectives
    training = [call for call in objective.calls if not call.validation]
    assert [call.step for call in training] == list(range(1, STEPS + 1))
    assert all(call.examples == 4 for call in training)
    assert not any(call.model_training or call.grad_enabled for call in objective.calls)
    # each training forward found the model training again: two micro-batches a step
    assert objective.forward_training == [True] * (2 * STEPS)
    # the validation at each checkpoint scores rollouts of the validation prompts too
    assert [(call.step, call.examples) for call in objective.calls if call.validation] == \
        [(2, 4), (3, 4), (4, 4), (6, 4)]
    lengths = [length for call in training for length in call.lengths]
    assert all(1 <= length <= MAX_NEW_TOKENS for length in lengths) and len(set(lengths)) > 1


def test_own_figures_reach_the_events_the_checkpoints_and_the_results_file(reference: Finished) -> None:
    [objective] = reference.objectives
    per_step = _per_step(reference.reporter)
    assert sorted(per_step) == list(range(1, STEPS + 1))
    for call in (call for call in objective.calls if not call.validation):
        assert per_step[call.step][1] == sum(call.lengths) / 4  # the mean over the step's completions
        assert 0.0 <= per_step[call.step][2] <= 1.0
    checkpoints = reference.reporter.of_kind("checkpoints")
    assert [c["step"] for c in checkpoints] == [2, 3, 4, 6]
    for checkpoint in checkpoints:
        assert tuple(checkpoint["metrics"][name] for name in OWN) == per_step[checkpoint["step"]][1:]
        assert checkpoint["metrics"]["valid_loss"] > 0  # validated on the prepared validation rollouts

    spec, store = reference.spec, reference.store
    text = store.get_bytes(layout.results_key(spec.tenant_id, spec.job_id)).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0] == ",".join(
        ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy", *OWN])
    assert {int(row["step"]): (float(row["train_loss"]), *(float(row[name]) for name in OWN)) for row in rows} \
        == per_step

    # the checkpoint keeps them in its history: a control plane that lost the events rebuilds them
    prefix = layout.checkpoint_prefix(spec.tenant_id, spec.job_id, STEPS)
    history = json.loads(store.get_bytes(layout.trainer_state_key(prefix)))["history"]
    rebuilt = metrics_data(history[2], STEPS)
    assert (rebuilt["step"], *(rebuilt[name] for name in OWN)) == (3, *per_step[3][1:])


def test_a_resumed_run_samples_and_trains_exactly_as_an_uninterrupted_one(
    tmp_path: Path, tiny_model_dir: Path, reference: Finished
) -> None:
    first, store = _stage(tmp_path, tiny_model_dir, extra={"stop_after_step": 3})
    reporter, second = RecordingReporter(), RecordingReporter(attempt=2)
    with registered() as built:
        assert run_attempt(first, store, reporter) == TrainerExit.PREEMPTED
        assert run_attempt(next_attempt(first), store, second) == TrainerExit.SUCCESS
    assert [c["step"] for c in reporter.of_kind("checkpoints")] == [2, 3]
    assert min(_per_step(second)) == 4  # the second attempt started at step 4, with step 4's rollouts
    assert [call.lengths for call in built[1].calls if not call.validation] == \
        [call.lengths for call in reference.objectives[0].calls if not call.validation][3:]
    assert {**_per_step(reporter), **_per_step(second)} == _per_step(reference.reporter)
    theirs, ours = _adapter(reference.store, reference.spec), _adapter(store, first)
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[name], ours[name]) for name in theirs)


@dataclass(frozen=True)
class PassThrough:
    """Supervised training with a rollout phase that changes nothing."""

    inner: TokenObjective
    name: str = "passthrough"

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)

    def prepare_step(self, examples: list[Any], context: Any) -> list[Any]:
        return examples


def build_passthrough(options: object) -> PassThrough:
    return PassThrough(TokenObjective("supervised", load_token_examples))


def test_the_seam_alone_changes_no_figure_of_an_existing_method(tmp_path: Path, tiny_model_dir: Path) -> None:
    def run(method: str) -> tuple[str, dict[str, torch.Tensor]]:
        spec, store = stage_job(tmp_path / method, tiny_model_dir, **OPTIONS)
        spec = replace(spec, method=method)
        assert run_attempt(spec, store, RecordingReporter()) == TrainerExit.SUCCESS
        return store.get_bytes(layout.results_key(spec.tenant_id, spec.job_id)).decode(), _adapter(store, spec)

    plain = run("supervised")
    wrapped = replace(methods.get("supervised"), name="passthrough",
                      objective="tests.unit.train.test_rollout:build_passthrough")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(methods._load(), "passthrough", wrapped)
        seamed = run("passthrough")
    assert seamed[0] == plain[0]  # every step's loss and accuracy, to the last digit
    assert seamed[1].keys() == plain[1].keys() and all(torch.equal(seamed[1][k], plain[1][k]) for k in plain[1])


def test_each_step_draws_its_own_numbers_whatever_came_before() -> None:
    cpu = torch.device("cpu")
    draws = {step: torch.rand(4, generator=step_generator(7, step, cpu)) for step in (1, 2)}
    assert torch.equal(torch.rand(4, generator=step_generator(7, 2, cpu)), draws[2])
    assert not torch.equal(draws[1], draws[2])
    assert not torch.equal(torch.rand(4, generator=step_generator(8, 2, cpu)), draws[2])
    assert not torch.equal(torch.rand(4, generator=step_generator(7, 2, cpu, validation=True)), draws[2])
