"""KTO on the tiny model, and its data shape.

Unpaired lines: each prompt has one completion, labelled desirable when it starts
with "good" and undesirable when it starts with "bad" (the rest random). On
held-out prompts, the trained adapter's log-probability margin of a "good"
answer over the same answer starting with "bad" grows well above the base
model's; a resumed run is bit-identical; bad lines are refused with their line.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny import stage_job
from tests.unit.train.test_methods import WORDS, _trained, assert_resumes_exactly, mean_margin, preference_pairs
from tuneforge import methods
from tuneforge.data.example import DataIssue
from tuneforge.data.shapes import check_method, normalize
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train.model import load_base_model
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


def kto_lines(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    lines = []
    for n in range(count):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        tail = " ".join(rng.choice(WORDS) for _ in range(2))
        desirable = n % 2 == 0
        lines.append({"input": {"messages": [{"role": "user", "content": prompt}]},
                      "output": [{"role": "assistant", "content": f"{'good' if desirable else 'bad'} {tail}"}],
                      "label": desirable})
    return lines


def test_kto_raises_the_held_out_margin_of_desirable_answers(tmp_path: Path, tiny_model_dir: Path) -> None:
    held_out = preference_pairs(16, seed=2)  # new prompts, each with a good and a bad answer
    spec, store = stage_job(tmp_path, tiny_model_dir, training=kto_lines(64, seed=1), validation=kto_lines(16, seed=2),
                            hyperparameters={"n_epochs": 4, "batch_size": 8, "micro_batch_size": 4,
                                             "learning_rate": 5e-3, "beta": 0.5, "desirable_weight": 1.0,
                                             "undesirable_weight": 1.0})
    spec = replace(spec, method="kto")
    reporter = RecordingReporter()
    assert run_attempt(spec, store, reporter) == TrainerExit.SUCCESS, reporter.reports[-3:]
    base, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    before = mean_margin(base.eval(), tokenizer, held_out)
    model, _ = _trained(tiny_model_dir, store, spec, tmp_path / "adapter")
    after = mean_margin(model, tokenizer, held_out)
    assert after > before + 2.0, (before, after)  # nats: a good answer now far likelier than a bad one
    [result] = reporter.of_kind("result")
    assert result["metrics"]["valid_mean_token_accuracy"] >= 0.9  # rewards on the side their labels ask for
    losses = [e["data"]["train_loss"] for e in reporter.events("metrics")]
    assert losses[0] == pytest.approx(0.5, abs=0.05)  # 1 - sigmoid(0): the policy starts as the reference
    assert min(losses[-4:]) < 0.35
    references = [key for key in store.list(layout.tenant_prefix(spec.tenant_id)) if "reference-logps" in key]
    assert len(references) == 2  # training and validation lines, computed once with the adapter off


def test_kto_resumes_exactly(tmp_path: Path, tiny_model_dir: Path) -> None:
    options = {"training": kto_lines(24, seed=3),
               "hyperparameters": {"n_epochs": 2, "batch_size": 4, "micro_batch_size": 2, "beta": 0.3,
                                   "desirable_weight": 1.0, "undesirable_weight": 1.2},
               "lora": {"dropout": 0.1}, "checkpoint": {"every_steps": 2}}
    assert_resumes_exactly(tmp_path, tiny_model_dir, "kto", options, stop_after_step=5)


# --- data shape ---------------------------------------------------------------------------


def test_kto_lines_normalise_in_both_shapes() -> None:
    [good] = kto_lines(1, seed=0)
    example, warnings = normalize(good, 3)
    assert (example.kind, example.line, warnings) == ("kto", 3, [])
    assert example.chosen == good["output"][0] and example.rejected is None
    example, _ = normalize({"prompt": "river stone", "completion": "bad idea", "label": False}, 4)
    assert example.kind == "kto" and example.rejected == {"role": "assistant", "content": "bad idea"}
    assert example.messages == [{"role": "user", "content": "river stone"}] and example.chosen is None
    check_method("kto", methods.get("kto").fit)
    with pytest.raises(DataIssue) as caught:
        check_method("kto", methods.get("dpo").fit, line=2)
    assert caught.value.code == "shape_mismatch"


@pytest.mark.parametrize(("change", "code", "field"), [
    ({"label": None}, "invalid_label", "label"),
    ({"label": "yes"}, "invalid_label", "label"),
    ({"label": 1}, "invalid_label", "label"),
    ({"output": [{"role": "user", "content": "hi"}]}, "invalid_preference", "output[0].role"),
    ({"output": []}, "invalid_preference", "output"),
    ({"extra": 1}, "unknown_key", "extra"),
])
def test_bad_kto_lines_name_their_line_and_field(change: dict, code: str, field: str) -> None:
    [line] = kto_lines(1, seed=0)
    with pytest.raises(DataIssue) as caught:
        normalize({**line, **change}, 7)
    assert (caught.value.code, caught.value.line, caught.value.field) == (code, 7, field)


def test_a_kto_line_without_its_label_names_the_line() -> None:
    [line] = kto_lines(1, seed=0)
    del line["label"]
    with pytest.raises(DataIssue) as caught:
        normalize(line, 12)
    assert (caught.value.code, caught.value.line, caught.value.field) == ("missing_key", 12, "label")


def test_kto_is_registered_with_its_options() -> None:
    kto = methods.get("kto")
    requested = kto.parse_hyperparameters({"beta": 0.2, "undesirable_weight": 1.5})
    options = kto.resolve_options(requested)
    assert options.model_dump() == {"beta": 0.2, "desirable_weight": 1.0, "undesirable_weight": 1.5}
    assert kto.stored_options(options.model_dump()) == options  # what the trainer reads back from the spec
    assert kto.data_kinds == ("kto",) and kto.sequences_per_example == 2
