"""ResolvedJob: the one codec of `jobs.resolved` reads what the platform has written
so far, fills what a partial row lacks, and a value cannot be changed in place."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tuneforge.domain.resolved import (
    DivergencePolicy,
    Estimate,
    ResolvedData,
    ResolvedEval,
    ResolvedGate,
    ResolvedJob,
    ResolvedResources,
)
from tuneforge.domain.spec import CheckpointPolicy, Hyperparameters, LoraConfig

# `jobs.resolved` of a supervised job with most extensions set, as the code before the typed
# configuration wrote it (services/training/validation.py, run through the API and the scheduler)
ROW_BEFORE_TYPES = {
    "checkpoint": {"every_minutes": 5.0, "every_steps": 7, "keep_last": 3, "keep_on_cancel": True},
    "data": {"contamination_threshold": 0.5, "dataset_id": "ds-0123abcd", "format": None,
             "long_examples": "truncate", "near_duplicate_threshold": 0.9, "pii_policy": "warn",
             "remove_duplicates": True, "train_examples": 17,
             "train_key": "tenants/tenant-alpha/datasets/ds-0123abcd/train.jsonl", "train_tokens": 534,
             "valid_examples": 3, "valid_key": "tenants/tenant-alpha/datasets/ds-0123abcd/valid.jsonl",
             "validation_split": 0.2},
    "divergence": {"loss_multiple": 3.0, "min_increase": 1.0, "patience_steps": 9},
    "estimate": {"currency": "USD", "estimated_gpu_hours": 0.0333, "estimated_price": 0.0667,
                 "estimated_runtime_seconds": 60.0, "gpu_type": "default", "gpus": 2, "price_per_gpu_hour": 2.0,
                 "steps": 34, "train_examples": 17, "training_tokens": 1068},
    "eval": {"enabled": True, "gates": [{"metric": "golden.loss", "op": "<=", "relative_to_base": True,
                                         "threshold": 1.0}],
             "golden": True, "max_examples": 200, "max_new_tokens": 64, "metrics": ["exact_match", "rouge_l"],
             "safety": True, "safety_detector": None, "task_file": "file-chat",
             "task_file_key": "tenants/tenant-alpha/files/file-chat/chat.jsonl"},
    "gpus": 2,
    "hyperparameters": {"batch_size": 1, "beta": 0.0, "gradient_accumulation_steps": 1, "learning_rate": 0.001,
                        "learning_rate_multiplier": 5.0, "lr_scheduler_type": "linear", "max_grad_norm": 1.0,
                        "max_seq_length": 256, "micro_batch_size": 1, "n_epochs": 2, "packing": True,
                        "train_on_inputs": False, "warmup_ratio": 0.1, "weight_decay": 0.0},
    "lora": {"alpha": 8, "dropout": 0.0, "rank": 4, "target_modules": "all-linear"},
    "num_examples": 17,
    "resources": {"gpu_memory_gb": 80.0, "gpu_type": "default", "gpus": 2, "gpus_per_node": 0,
                  "gradient_checkpointing": False},
}


def _full_job() -> ResolvedJob:
    return ResolvedJob(
        method="dpo", training_type="qlora",
        hyperparameters=Hyperparameters(n_epochs=2, batch_size=16, micro_batch_size=4, gradient_accumulation_steps=4,
                                        learning_rate=5e-5, method_options={"beta": 0.2}),
        lora=LoraConfig(rank=16, alpha=32, dropout=0.05, target_modules=["q_proj", "v_proj"]),
        checkpoint=CheckpointPolicy(every_steps=10, keep_last=2, every_minutes=15.0, keep_on_cancel=True),
        resources=ResolvedResources(gpus=8, gpus_per_node=4, gpu_type="a100-80gb", gpu_memory_gb=80.0,
                                    gradient_checkpointing=True),
        num_examples=1000,
        data=ResolvedData(dataset_id="ds-1", train_key="k/train.jsonl", valid_key="k/valid.jsonl",
                          train_examples=1000, valid_examples=50, train_tokens=123_456, format="jsonl",
                          remove_duplicates=True, pii_policy="redact", validation_split=0.05),
        estimate=Estimate(training_tokens=246_912, train_examples=1000, steps=125, estimated_runtime_seconds=600.0,
                          estimated_gpu_hours=1.3333, gpu_type="a100-80gb", gpus=8, price_per_gpu_hour=2.5,
                          estimated_price=3.3333, currency="EUR"),
        divergence=DivergencePolicy(loss_multiple=3.0, patience_steps=5, min_increase=0.5),
        eval=ResolvedEval(task_file="file-task", metrics=("exact_match", {"type": "regex", "pattern": "^\\d+$"}),
                          gates=(ResolvedGate("task.exact_match", ">=", 0.5),
                                 ResolvedGate("golden.loss", "<=", 0.5, relative_to_base=True)),
                          safety=False,
                          safety_detector={"type": "guard_model", "endpoint": "http://g/v1", "model": "g"},
                          max_new_tokens=32, max_examples=100, task_file_key="tenants/t/files/file-task/task.jsonl"),
        extra={"stop_after_step": 3},
    )


def test_a_resolved_job_survives_its_json_round_trip():
    job = _full_job()
    assert ResolvedJob.from_json(job.to_json()) == job
    default = ResolvedJob()
    assert ResolvedJob.from_json(default.to_json()) == default


def test_a_row_written_before_the_types_reads_back_with_the_same_values():
    row = copy.deepcopy(ROW_BEFORE_TYPES)
    job = ResolvedJob.from_json(row)
    assert row == ROW_BEFORE_TYPES  # reading does not change the row
    assert job.hyperparameters == Hyperparameters.from_dict(ROW_BEFORE_TYPES["hyperparameters"])
    assert job.lora == LoraConfig(rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    assert job.checkpoint == CheckpointPolicy(every_steps=7, keep_last=3, every_minutes=5.0, keep_on_cancel=True,
                                              every_epoch=False)  # as it ran before epoch checkpoints
    assert job.gpus == 2 and job.resources.gpus_per_node == 0 and job.resources.gpu_type == "default"
    assert job.num_examples == 17 and job.data.dataset_id == "ds-0123abcd" and job.data.valid_examples == 3
    assert job.data.validation_split == 0.2 and job.data.remove_duplicates is True
    assert job.estimate.steps == 34 and job.estimate.estimated_price == 0.0667
    assert job.divergence == DivergencePolicy(loss_multiple=3.0, patience_steps=9, min_increase=1.0)
    assert job.eval.metrics == ("exact_match", "rouge_l") and job.eval.task_file_key.endswith("chat.jsonl")
    assert job.eval.gates == (ResolvedGate("golden.loss", "<=", 1.0, relative_to_base=True),)
    assert job.extra == {}
    # written again: the same keys and values, plus the ones the types added
    written = job.to_json()
    # the same values; a method's own (beta) now sit in hyperparameters.method_options
    typed = ("hyperparameters", "resources", "checkpoint")
    assert {key: written[key] for key in ROW_BEFORE_TYPES if key not in typed} == \
        {key: value for key, value in ROW_BEFORE_TYPES.items() if key not in typed}
    # checkpoint: the same, plus that it did not checkpoint by epoch
    assert written["checkpoint"] == {**ROW_BEFORE_TYPES["checkpoint"], "every_epoch": False}
    # resources: the same, plus how several GPUs share the job (none was chosen then) and the capacity it
    # asked for (none: as its tier says), not on the shared pool, on any GPU (no type or memory need)
    assert written["resources"] == {**ROW_BEFORE_TYPES["resources"], "strategy": "", "capacity": "",
                                    "deadline": None, "max_price": None, "shared_pool": False,
                                    "required_gpu_type": "", "min_gpu_memory_gb": 0.0}
    assert Hyperparameters.from_dict(written["hyperparameters"]).flat() == ROW_BEFORE_TYPES["hyperparameters"]
    assert set(written) - set(ROW_BEFORE_TYPES) == {"method", "training_type", "extra"}


def test_a_partial_row_takes_the_defaults_of_what_it_lacks():
    job = ResolvedJob.from_json({"hyperparameters": {"learning_rate": 2e-4, "n_epochs": 3}, "lora": {"rank": 8}})
    assert job.hyperparameters == Hyperparameters(learning_rate=2e-4, n_epochs=3)
    assert job.lora == LoraConfig(rank=8)
    assert job.method == "supervised" and job.training_type == "lora"
    assert job.checkpoint == CheckpointPolicy() and job.resources == ResolvedResources() and job.gpus == 1
    assert job.data == ResolvedData() and job.num_examples == 0
    assert job.estimate is None and job.divergence is None and job.eval is None and job.extra == {}
    assert ResolvedJob.from_json({}) == ResolvedJob()
    # the GPU count at the top level fills resources that lack it; unknown keys are ignored
    assert ResolvedJob.from_json({"gpus": 4, "resources": {"gpus_per_node": 2}, "future": 1}).resources == \
        ResolvedResources(gpus=4, gpus_per_node=2)
    assert ResolvedJob.from_json({"eval": {"gates": [{"metric": "golden.loss", "op": "<=", "threshold": 1}]}}
                                 ).eval == ResolvedEval(gates=(ResolvedGate("golden.loss", "<=", 1),))


def test_resolved_values_are_frozen_and_change_by_replacement():
    job = _full_job()
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.method = "supervised"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.hyperparameters.micro_batch_size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.eval.gates[0].threshold = 0.0  # type: ignore[misc]
    smaller = dataclasses.replace(job, hyperparameters=dataclasses.replace(job.hyperparameters, micro_batch_size=2))
    assert smaller.hyperparameters.micro_batch_size == 2 and job.hyperparameters.micro_batch_size == 4
    assert smaller.to_json()["hyperparameters"]["micro_batch_size"] == 2


def test_every_field_is_documented():
    import ast
    import inspect

    from tuneforge.domain import resolved

    tree = ast.parse(inspect.getsource(resolved))
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for index, statement in enumerate(body):
            if isinstance(statement, ast.AnnAssign):
                following = body[index + 1] if index + 1 < len(body) else None
                documented = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                    and isinstance(following.value.value, str)
                assert documented, f"{node.name}.{statement.target.id} has no docstring"
