"""Deleting a file deletes what was derived from it: the prepared datasets of its jobs, with their
tokenized caches and reference log-probabilities; one an unfinished job still reads is kept, and
the answer says which and why."""

from __future__ import annotations

import io

from sqlalchemy import select

from tests.helpers.platform import chat_lines
from tuneforge.db.tables import Job
from tuneforge.domain.resolved import ResolvedData, ResolvedJob
from tuneforge.storage import layout


def _job_on(world, training: str, dataset_id: str, status: str) -> str:
    sdk = world.sdk(world.key_a)
    job = sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training)
    with world.platform.db.session() as session:
        row = session.scalar(select(Job).where(Job.job_id == job.id))
        row.status = status
        row.resolved = ResolvedJob(data=ResolvedData(dataset_id=dataset_id,
                                                     train_key=layout.dataset_key(row.tenant_id, dataset_id,
                                                                                  "train.jsonl")))
        tenant_id = row.tenant_id
    train_key = layout.dataset_key(tenant_id, dataset_id, "train.jsonl")
    store = world.platform.store
    store.put_bytes(train_key, b"{}\n")
    store.put_bytes(layout.tokenized_key(train_key, "tok1"), b"npz")
    store.put_bytes(layout.reference_logps_key(train_key, "ref1"), b"npy")
    return tenant_id


def test_deleting_a_file_deletes_its_prepared_datasets_but_those_a_running_job_reads(world):
    sdk = world.sdk(world.key_a)
    done_file = sdk.files.create(file=("a.jsonl", io.BytesIO(chat_lines(12, "a"))), purpose="fine-tune").id
    busy_file = sdk.files.create(file=("b.jsonl", io.BytesIO(chat_lines(12, "b"))), purpose="fine-tune").id
    tenant_id = _job_on(world, done_file, "ds-done", "succeeded")
    _job_on(world, busy_file, "ds-busy", "running")
    headers = world.headers(world.key_a)
    store = world.platform.store

    gone = world.http.delete(f"/v1/files/{done_file}", headers=headers)
    assert gone.status_code == 200, gone.text
    assert gone.json()["derived_deleted"] == ["ds-done"] and gone.json()["derived_kept"] == []
    assert store.list(layout.dataset_prefix(tenant_id, "ds-done")) == []
    assert store.list(layout.file_prefix(tenant_id, done_file)) == []

    kept = world.http.delete(f"/v1/files/{busy_file}", headers=headers).json()
    assert kept["derived_deleted"] == []
    assert [entry["dataset_id"] for entry in kept["derived_kept"]] == ["ds-busy"]
    assert len(store.list(layout.dataset_prefix(tenant_id, "ds-busy"))) == 3  # the running job still reads it
    # the OpenAI SDK still reads the answer as its FileDeleted
    third = sdk.files.create(file=("c.jsonl", io.BytesIO(chat_lines(12, "c"))), purpose="fine-tune").id
    assert sdk.files.delete(third).deleted is True
