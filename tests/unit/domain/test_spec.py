"""JobSpec: what one attempt is told, as typed values that survive the JSON file the trainer reads."""

from __future__ import annotations

import json

import pytest

from tuneforge.domain.resolved import ResolvedEval, ResolvedGate
from tuneforge.domain.spec import (
    BaseModelRef,
    CheckpointPolicy,
    DataFileRef,
    Hyperparameters,
    JobSpec,
    LoraConfig,
)

EVAL = ResolvedEval.from_json({
    "enabled": True, "metrics": ["exact_match", {"type": "regex", "pattern": "^\\d+$"}],
    "gates": [{"metric": "golden.loss", "op": "<=", "threshold": 0.5, "relative_to_base": True}],
    "safety_detector": {"type": "guard_model", "endpoint": "http://judge.example/v1", "model": "guard"},
    "max_new_tokens": 32, "task_file_key": "tenants/t/files/file-1/tasks.jsonl"})


def _spec(**changes) -> JobSpec:
    fields = dict(
        job_id="ftjob-1", tenant_id="t", attempt=2, seed=7, base_model=BaseModelRef("tiny", "0" * 64, "base/tiny"),
        training_file=DataFileRef("file-1", "tenants/t/datasets/ds-1/train.jsonl"), validation_file=None,
        method="kto", training_type="lora", lora=LoraConfig(rank=4, alpha=8),
        hyperparameters=Hyperparameters(n_epochs=2, method_options={"beta": 0.2, "desirable_weight": 1.5}),
        checkpoint=CheckpointPolicy(every_steps=10), storage_url="/objects", callback_url="http://127.0.0.1:1",
        job_token="token", gradient_checkpointing=True, cpu_threads=2, eval=EVAL)
    return JobSpec(**{**fields, **changes})


def test_a_spec_reads_back_equal_from_its_json() -> None:
    spec = _spec()
    back = JobSpec.from_dict(json.loads(spec.to_json()))
    assert back == spec
    assert back.eval.gates == (ResolvedGate("golden.loss", "<=", 0.5, relative_to_base=True),)
    assert back.hyperparameters.method_options == {"beta": 0.2, "desirable_weight": 1.5}
    assert JobSpec.from_dict(json.loads(_spec(eval=None).to_json())).eval is None


def test_a_spec_of_an_older_release_reads_its_options_from_extra() -> None:
    old = json.loads(_spec().to_json())
    old["extra"] = {"eval": old.pop("eval"), "cpu_threads": 3, "gradient_checkpointing": True,
                    "stop_after_step": 4}
    del old["cpu_threads"], old["gradient_checkpointing"]
    old["hyperparameters"] = {**old["hyperparameters"], "beta": 0.3}
    del old["hyperparameters"]["method_options"]
    spec = JobSpec.from_dict(old)
    assert spec.eval == EVAL and spec.cpu_threads == 3 and spec.gradient_checkpointing is True
    assert spec.extra == {"stop_after_step": 4}  # only injected faults stay there
    assert spec.hyperparameters.method_options == {"beta": 0.3}


def test_an_unknown_field_is_refused() -> None:
    raw = json.loads(_spec().to_json())
    with pytest.raises(TypeError):
        JobSpec.from_dict({**raw, "callback_env": "DATABASE_URL"})
