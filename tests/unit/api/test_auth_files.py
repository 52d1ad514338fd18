from __future__ import annotations

import io

import openai
import pytest

from tests.helpers.platform import chat_lines


def test_missing_and_invalid_key_answer_401_in_openai_envelope(world):
    response = world.http.get("/v1/files")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    response = world.http.get("/v1/files", headers=world.headers("tf-not-a-key"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        world.sdk("tf-wrong").files.list()


def test_upload_valid_file_is_processed_and_round_trips(world):
    sdk = world.sdk(world.key_a)
    data = chat_lines(12)
    created = sdk.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert created.id.startswith("file-")
    assert created.status == "processed"
    assert created.bytes == len(data)
    assert created.filename == "train.jsonl"
    assert sdk.files.retrieve(created.id).id == created.id
    assert sdk.files.content(created.id).read() == data


def test_upload_invalid_jsonl_records_error_with_line(world):
    sdk = world.sdk(world.key_a)
    data = chat_lines(3) + b'{"messages": [\n'
    created = sdk.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert created.status == "error"
    assert "line 4" in created.status_details
    assert "invalid_json" in created.status_details


def test_upload_rejects_unknown_purpose_and_creates_nothing(world):
    sdk = world.sdk(world.key_a)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.files.create(file=("x.jsonl", io.BytesIO(chat_lines(1))), purpose="nonsense")
    assert info.value.body["param"] == "purpose"
    assert sdk.files.list().data == []


def test_list_pages_with_cursor_newest_first(world):
    sdk = world.sdk(world.key_a)
    ids = [sdk.files.create(file=(f"f{i}.jsonl", io.BytesIO(chat_lines(1))), purpose="fine-tune").id
           for i in range(5)]
    first = sdk.files.list(limit=2)
    assert [f.id for f in first.data] == ids[::-1][:2]
    assert first.has_more is True
    everything = [f.id for f in sdk.files.list(limit=2)]  # the SDK follows `after`
    assert everything == ids[::-1]


def test_delete_removes_file_and_its_object(world):
    sdk = world.sdk(world.key_a)
    created = sdk.files.create(file=("t.jsonl", io.BytesIO(chat_lines(2))), purpose="fine-tune")
    deleted = sdk.files.delete(created.id)
    assert deleted.deleted is True and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(created.id)
    assert (world.platform.store.list("tenants") == []
            or all(created.id not in k for k in world.platform.store.list("tenants")))


def test_another_tenants_file_answers_404_everywhere(world):
    mine = world.sdk(world.key_a).files.create(file=("t.jsonl", io.BytesIO(chat_lines(2))), purpose="fine-tune")
    theirs = world.sdk(world.key_b)
    with pytest.raises(openai.NotFoundError):
        theirs.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.delete(mine.id)
    assert theirs.files.list().data == []
    assert world.sdk(world.key_a).files.retrieve(mine.id).id == mine.id


def test_a_write_is_committed_before_the_answer(world, monkeypatch):
    """A client answered 200 may rely on the write being stored: the request's unit of
    work commits before the response is sent, so a failing commit is never a 200."""
    from sqlalchemy.orm import Session

    def failing_commit(self):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(Session, "commit", failing_commit)
    response = world.http.post(
        "/v1/files", headers=world.headers(world.key_a),
        files={"file": ("train.jsonl", chat_lines(12))}, data={"purpose": "fine-tune"},
    )
    assert response.status_code == 500
    monkeypatch.undo()
    listed = world.http.get("/v1/files", headers=world.headers(world.key_a)).json()
    assert listed["data"] == []


def test_a_file_object_carries_the_sha256_of_its_bytes(world):
    import hashlib

    sdk = world.sdk(world.key_a)
    data = chat_lines(12)
    created = sdk.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
    digest = hashlib.sha256(data).hexdigest()
    assert created.model_dump()["sha256"] == digest
    listed = world.http.get("/v1/files", headers=world.headers(world.key_a)).json()["data"]
    assert [(f["id"], f["sha256"]) for f in listed] == [(created.id, digest)]
    assert world.http.get(f"/v1/files/{created.id}", headers=world.headers(world.key_a)).json()["sha256"] == digest


def test_a_bad_file_points_at_its_own_full_report(world):
    sdk = world.sdk(world.key_a)
    data = chat_lines(3) + b'{"messages": [\n' + b'{"messages": "oops"}\n'
    created = sdk.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert created.status == "error"
    assert f"see GET /v1/files/{created.id}/validation)" in created.status_details
    assert "{id}" not in created.status_details
    report = world.http.get(f"/v1/files/{created.id}/validation", headers=world.headers(world.key_a))
    assert report.status_code == 200
