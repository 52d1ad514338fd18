"""A job's data is prepared in a check worker under a deadline: what it writes is the same as a
check in this process would write, and a file that takes too long fails as a data error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tuneforge.services.datasets import checks as datasets
from tuneforge.storage.store import open_store


def _request(training_key: str, validation_key: str | None = None) -> datasets.PrepareRequest:
    return datasets.PrepareRequest(
        tenant_id="tenant-a", training=(training_key, "train.jsonl", "a" * 64),
        validation=(validation_key, "valid.jsonl", "b" * 64) if validation_key else None, base_sha256="0" * 64,
        method="supervised", max_seq_length=128, seed=3, options={"validation_split": 0.25}, pii_policy="warn")


def _chat_lines(count: int) -> bytes:
    return "".join(json.dumps({"messages": [{"role": "user", "content": f"question {n}?"},
                                            {"role": "assistant", "content": f"answer {n}"}]}) + "\n"
                   for n in range(count)).encode()


@pytest.fixture
def staged(tmp_path: Path, tiny_model_dir: Path):
    store = open_store(str(tmp_path / "objects"))
    store.put_bytes("tenants/tenant-a/files/file-1/train.jsonl", _chat_lines(40))
    return store, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_worker_writes_the_prepared_split_and_counts_its_tokens(staged) -> None:
    store, tokenizer = staged
    prepared = datasets.prepare_for_job(store, _request("tenants/tenant-a/files/file-1/train.jsonl"), tokenizer,
                                        min_examples=10)
    assert (prepared.train_examples, prepared.valid_examples) == (30, 10)
    train_lines = store.get_bytes(prepared.train_key).decode().splitlines()
    valid_lines = store.get_bytes(prepared.valid_key).decode().splitlines()
    assert len(train_lines) == 30 and len(valid_lines) == 10
    assert prepared.train_tokens > 30 * 5  # every example's prompt and answer, tokenized
    again = datasets.prepare_for_job(store, _request("tenants/tenant-a/files/file-1/train.jsonl"), tokenizer,
                                     min_examples=10)
    assert again.reused and again.train_key == prepared.train_key


def test_an_estimate_checks_and_counts_but_writes_nothing(staged) -> None:
    store, tokenizer = staged
    before = set(store.list("tenants/tenant-a/"))
    prepared = datasets.prepare_for_job(store, _request("tenants/tenant-a/files/file-1/train.jsonl"), tokenizer,
                                        min_examples=10, keep=False)
    assert prepared.train_examples == 30
    assert set(store.list("tenants/tenant-a/")) == before


def test_too_few_examples_fail_the_training_file(staged) -> None:
    store, tokenizer = staged
    with pytest.raises(datasets.DataCheckFailed) as failed:
        datasets.prepare_for_job(store, _request("tenants/tenant-a/files/file-1/train.jsonl"), tokenizer,
                                 min_examples=35)
    assert failed.value.which == "training_file"
    assert "too_few_examples" in failed.value.report.errors.counts


def test_preparing_past_the_deadline_fails_as_a_data_error_and_writes_nothing(staged, monkeypatch) -> None:
    store, tokenizer = staged
    before = set(store.list("tenants/tenant-a/"))
    monkeypatch.setattr(datasets, "PREPARE_DEADLINE_FACTOR", 1e-6)
    with pytest.raises(datasets.DataCheckFailed) as failed:
        datasets.prepare_for_job(store, _request("tenants/tenant-a/files/file-1/train.jsonl"), tokenizer,
                                 min_examples=10)
    assert failed.value.which == "training_file"
    [code] = failed.value.report.errors.counts
    assert code == "check_timeout"
    assert set(store.list("tenants/tenant-a/")) == before
