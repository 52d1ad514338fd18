"""DPO and KTO jobs through a running server and a real trainer process, with the official SDK:
the preference data, the method's hyperparameters and the reference log-probs travel
from the create body to the trainer, and the adapter comes back preferring the chosen
answers on held-out pairs."""

from __future__ import annotations

import io
import json

import pytest
import torch

from tests.e2e.test_lifecycle import download, wait_for
from tests.helpers.files import processed
from tests.unit.train.test_methods import mean_margin, preference_pairs
from tuneforge.train.model import load_base_model

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]


def _file(pairs: list[dict]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(p) + "\n" for p in pairs).encode())


def test_dpo_job_through_the_sdk_prefers_the_chosen_answers(running, tmp_path):
    from peft import PeftModel

    sdk = running.sdk(running.key_a)
    training = sdk.files.create(file=("pairs.jsonl", _file(preference_pairs(48, seed=1))), purpose="fine-tune")
    held_out = preference_pairs(16, seed=2)
    validation = sdk.files.create(file=("held.jsonl", _file(held_out)), purpose="fine-tune")
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training.id, validation_file=validation.id, seed=0,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.5, "n_epochs": 4, "batch_size": 8,
                                                            "learning_rate_multiplier": 100}}},
    )
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    assert done.method.type == "dpo" and done.method.dpo.hyperparameters.beta == 0.5
    metrics = [e.data for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
    assert {m["step"] for m in metrics} == set(range(1, metrics[0]["total_steps"] + 1))
    folder = download(running.url, running.key_a, job.id, tmp_path)
    base, tokenizer = load_base_model(running.model_dir, torch.device("cpu"))
    before = mean_margin(base.eval(), tokenizer, held_out)
    trained = PeftModel.from_pretrained(load_base_model(running.model_dir, torch.device("cpu"))[0], str(folder))
    assert mean_margin(trained.eval(), tokenizer, held_out) > before + 2.0


def test_kto_job_through_the_sdk_raises_the_margin_of_desirable_answers(running, tmp_path):
    from peft import PeftModel

    from tests.unit.train.test_kto import kto_lines

    sdk = running.sdk(running.key_a)
    training = processed(sdk, sdk.files.create(file=("kto.jsonl", _file(kto_lines(64, seed=1))),
                                               purpose="fine-tune").id)
    assert training.status == "processed", training.status_details
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training.id, seed=0,
        method={"type": "kto", "kto": {"hyperparameters": {"beta": 0.5, "desirable_weight": 1.0,
                                                            "undesirable_weight": 1.0, "n_epochs": 4,
                                                            "batch_size": 8, "learning_rate_multiplier": 100}}},
    )
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    hp = done.method.model_dump()["kto"]["hyperparameters"]
    assert done.method.type == "kto" and hp["beta"] == 0.5 and hp["undesirable_weight"] == 1.0
    folder = download(running.url, running.key_a, job.id, tmp_path)
    held_out = preference_pairs(16, seed=2)
    base, tokenizer = load_base_model(running.model_dir, torch.device("cpu"))
    before = mean_margin(base.eval(), tokenizer, held_out)
    trained = PeftModel.from_pretrained(load_base_model(running.model_dir, torch.device("cpu"))[0], str(folder))
    assert mean_margin(trained.eval(), tokenizer, held_out) > before + 2.0


def test_bad_kto_lines_are_refused_with_their_line(running):
    from tests.unit.train.test_kto import kto_lines

    sdk = running.sdk(running.key_a)
    lines = kto_lines(6, seed=3)
    lines[3]["label"] = "yes"
    uploaded = processed(sdk, sdk.files.create(file=("kto.jsonl", _file(lines)), purpose="fine-tune").id)
    assert uploaded.status == "error"
    assert "line 4" in uploaded.status_details and "invalid_label" in uploaded.status_details
    del lines[3]["label"]
    uploaded = processed(sdk, sdk.files.create(file=("kto.jsonl", _file(lines)), purpose="fine-tune").id)
    assert uploaded.status == "error"
    assert "line 4" in uploaded.status_details and "label" in uploaded.status_details
