"""Uploads API (docs/openai-compat.md, "Uploads"): the official SDK's calls against a live server."""

from __future__ import annotations

import hashlib
import threading
import time

import httpx
import openai
import pytest

from tests.helpers.platform import chat_lines
from tuneforge.db.tables import UploadRow
from tuneforge.services.datasets import uploads as upload_service
from tuneforge.storage import layout


def _tenant_of(live, upload_id: str) -> str:
    with live.plane.platform.db.session() as session:
        return session.query(UploadRow).filter_by(upload_id=upload_id).one().tenant_id


def test_upload_file_chunked_makes_a_validated_file_from_many_parts(live, tmp_path):
    sdk = live.sdk()
    data = chat_lines(200)
    path = tmp_path / "train.jsonl"
    path.write_bytes(data)
    upload = sdk.uploads.upload_file_chunked(file=path, mime_type="application/jsonl", purpose="fine-tune",
                                             part_size=4096, md5=hashlib.md5(data).hexdigest())
    assert upload.status == "completed" and upload.object == "upload"
    assert upload.bytes == len(data) and upload.filename == "train.jsonl" and upload.purpose == "fine-tune"
    assert upload.expires_at == upload.created_at + 3600
    file = upload.file
    assert file is not None and file.id.startswith("file-") and file.status == "processed"
    assert file.bytes == len(data)
    assert sdk.files.retrieve(file.id).filename == "train.jsonl"
    assert sdk.files.content(file.id).read() == data
    report = httpx.get(f"{live.url}/v1/files/{file.id}/validation",
                       headers={"Authorization": f"Bearer {live.key_a}"}).json()
    assert report["num_examples"] == 200
    # the parts are gone from the store once they made the file
    tenant = _tenant_of(live, upload.id)
    assert live.store.list(layout.upload_prefix(tenant, upload.id)) == []
    assert upload.id.startswith("upload_")


def test_parts_are_put_together_in_the_order_complete_names(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=9, filename="notes.txt", mime_type="text/plain", purpose="user_data")
    assert upload.status == "pending" and upload.file is None
    first = sdk.uploads.parts.create(upload.id, data=b"abc")
    second = sdk.uploads.parts.create(upload.id, data=b"def")
    third = sdk.uploads.parts.create(upload.id, data=b"ghi")
    assert first.object == "upload.part" and first.upload_id == upload.id and first.id.startswith("part_")
    done = sdk.uploads.complete(upload.id, part_ids=[third.id, first.id, second.id])
    assert done.status == "completed"
    assert sdk.files.content(done.file.id).read() == b"ghiabcdef"
    assert done.file.status == "processed"  # not a fine-tune file: no validation


def test_a_wrong_md5_leaves_the_upload_pending_and_loses_nothing(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=6, filename="x.txt", mime_type="text/plain", purpose="user_data")
    a = sdk.uploads.parts.create(upload.id, data=b"abc")
    b = sdk.uploads.parts.create(upload.id, data=b"def")
    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.complete(upload.id, part_ids=[b.id, a.id], md5=hashlib.md5(b"abcdef").hexdigest())
    assert err.value.code == "md5_mismatch" and err.value.param == "md5"
    assert sdk.files.list().data == []  # no file was made
    done = sdk.uploads.complete(upload.id, part_ids=[a.id, b.id], md5=hashlib.md5(b"abcdef").hexdigest())
    assert sdk.files.content(done.file.id).read() == b"abcdef"


def test_sizes_must_add_up_to_the_declared_bytes(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=5, filename="x.txt", mime_type="text/plain", purpose="user_data")
    part = sdk.uploads.parts.create(upload.id, data=b"abc")
    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.complete(upload.id, part_ids=[part.id])
    assert err.value.code == "upload_size_mismatch" and "3 bytes" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # 3 + 4 > 5: refused, and its bytes deleted
        sdk.uploads.parts.create(upload.id, data=b"defg")
    assert err.value.code == "upload_size_exceeded"
    tenant = _tenant_of(live, upload.id)
    assert len(live.store.list(layout.upload_prefix(tenant, upload.id))) == 1
    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.complete(upload.id, part_ids=[part.id, "part_nope"])
    assert err.value.param == "part_ids[1]" and err.value.code == "invalid_part"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.complete(upload.id, part_ids=[part.id, part.id])
    assert err.value.code == "duplicate_part"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.complete(upload.id, part_ids=[])
    assert err.value.param == "part_ids"


def test_cancel_ends_the_upload_and_deletes_its_parts(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=10, filename="x.txt", mime_type="text/plain", purpose="user_data")
    part = sdk.uploads.parts.create(upload.id, data=b"abc")
    tenant = _tenant_of(live, upload.id)
    assert len(live.store.list(layout.upload_prefix(tenant, upload.id))) == 1
    cancelled = sdk.uploads.cancel(upload.id)
    assert cancelled.status == "cancelled"
    assert live.store.list(layout.upload_prefix(tenant, upload.id)) == []
    for call in (lambda: sdk.uploads.parts.create(upload.id, data=b"x"),
                 lambda: sdk.uploads.complete(upload.id, part_ids=[part.id])):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.code == "upload_not_pending"
    assert sdk.uploads.cancel(upload.id).status == "cancelled"  # again: the same answer


def test_a_completed_upload_takes_no_more_parts_and_cannot_be_cancelled(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=3, filename="x.txt", mime_type="text/plain", purpose="user_data")
    part = sdk.uploads.parts.create(upload.id, data=b"abc")
    sdk.uploads.complete(upload.id, part_ids=[part.id])
    for call in (lambda: sdk.uploads.parts.create(upload.id, data=b"x"), lambda: sdk.uploads.cancel(upload.id),
                 lambda: sdk.uploads.complete(upload.id, part_ids=[part.id])):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.code == "upload_not_pending"


def test_an_upload_expires_after_its_hour_and_its_parts_go(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=10, filename="x.txt", mime_type="text/plain", purpose="user_data")
    sdk.uploads.parts.create(upload.id, data=b"abc")
    other = sdk.uploads.create(bytes=10, filename="y.txt", mime_type="text/plain", purpose="user_data")
    sdk.uploads.parts.create(other.id, data=b"abc")
    tenant = _tenant_of(live, upload.id)
    platform = live.plane.platform
    with platform.db.session() as session:  # the sweep: an hour later
        assert upload_service.expire(session, platform.store, time.time() + 3601) == 2
    assert live.store.list(layout.upload_prefix(tenant, upload.id)) == []
    headers = {"Authorization": f"Bearer {live.key_a}"}
    assert httpx.get(f"{live.url}/v1/uploads/{upload.id}", headers=headers).json()["status"] == "expired"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.parts.create(upload.id, data=b"x")
    assert err.value.code == "upload_not_pending" and "expired" in err.value.message


def test_an_upload_past_its_hour_is_expired_on_the_next_request(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=10, filename="x.txt", mime_type="text/plain", purpose="user_data")
    sdk.uploads.parts.create(upload.id, data=b"abc")
    with live.plane.platform.db.session() as session:
        session.query(UploadRow).filter_by(upload_id=upload.id).update({"expires_at": int(time.time()) - 1})
    headers = {"Authorization": f"Bearer {live.key_a}"}
    assert httpx.get(f"{live.url}/v1/uploads/{upload.id}", headers=headers).json()["status"] == "expired"
    assert live.store.list(layout.upload_prefix(_tenant_of(live, upload.id), upload.id)) == []


def test_resuming_client_reads_back_which_parts_arrived(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=6, filename="x.txt", mime_type="text/plain", purpose="user_data")
    first = sdk.uploads.parts.create(upload.id, data=b"abcd")
    headers = {"Authorization": f"Bearer {live.key_a}"}
    state = httpx.get(f"{live.url}/v1/uploads/{upload.id}", headers=headers).json()
    assert state["status"] == "pending" and state["received_bytes"] == 4
    parts = httpx.get(f"{live.url}/v1/uploads/{upload.id}/parts", headers=headers).json()
    assert [(p["id"], p["bytes"]) for p in parts["data"]] == [(first.id, 4)]


def test_create_refuses_what_cannot_become_a_file_naming_the_field(live):
    sdk = live.sdk()
    cases = [
        (dict(bytes=0, filename="a.jsonl", mime_type="application/jsonl", purpose="fine-tune"), "bytes"),
        (dict(bytes=3 * 1024 ** 3, filename="a.jsonl", mime_type="application/jsonl", purpose="fine-tune"),
         "bytes"),  # past the standard tier's 2 GiB
        (dict(bytes=10, filename="a.jsonl", mime_type="image/png", purpose="fine-tune"), "mime_type"),
        (dict(bytes=10, filename="a.jsonl", mime_type="not a type", purpose="user_data"), "mime_type"),
        (dict(bytes=10, filename="a.jsonl", mime_type="application/jsonl", purpose="vision-ish"), "purpose"),
        (dict(bytes=10, filename="..", mime_type="text/plain", purpose="user_data"), "filename"),
        (dict(bytes=10, filename="a.txt", mime_type="text/plain", purpose="user_data",
              expires_after={"anchor": "created_at", "seconds": 60}), "expires_after.seconds"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            sdk.uploads.create(**kwargs)
        assert err.value.param == param, (kwargs, err.value.message)


def test_expires_after_gives_the_file_an_expiry(live):
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=3, filename="x.txt", mime_type="text/plain", purpose="batch",
                                expires_after={"anchor": "created_at", "seconds": 7200})
    part = sdk.uploads.parts.create(upload.id, data=b"abc")
    file = sdk.uploads.complete(upload.id, part_ids=[part.id]).file
    assert file.expires_at == file.created_at + 7200


def test_another_tenants_upload_is_not_found(live):
    upload = live.sdk().uploads.create(bytes=3, filename="x.txt", mime_type="text/plain", purpose="user_data")
    part = live.sdk().uploads.parts.create(upload.id, data=b"abc")
    other = live.sdk(live.key_b)
    for call in (lambda: other.uploads.parts.create(upload.id, data=b"x"), lambda: other.uploads.cancel(upload.id),
                 lambda: other.uploads.complete(upload.id, part_ids=[part.id])):
        with pytest.raises(openai.NotFoundError):
            call()
    response = httpx.get(f"{live.url}/v1/uploads/{upload.id}/parts", headers={"Authorization": f"Bearer {live.key_b}"})
    assert response.status_code == 404


def test_a_part_over_the_limit_is_refused_with_413(live, monkeypatch):
    monkeypatch.setattr(upload_service, "MAX_PART_BYTES", 1024)
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=100_000, filename="x.txt", mime_type="text/plain", purpose="user_data")
    with pytest.raises(openai.APIStatusError) as err:
        sdk.uploads.parts.create(upload.id, data=b"x" * 50_000)
    assert err.value.status_code == 413
    assert live.store.list(layout.upload_prefix(_tenant_of(live, upload.id), upload.id)) == []


def test_parallel_parts_never_add_up_past_the_declared_size(live):
    """Eight parts of 100 bytes race for an upload of 300: exactly three land."""
    sdk = live.sdk()
    upload = sdk.uploads.create(bytes=300, filename="x.txt", mime_type="text/plain", purpose="user_data")
    answers: list[object] = []

    def send(index: int) -> None:
        try:
            answers.append(live.sdk().uploads.parts.create(upload.id, data=bytes([65 + index]) * 100))
        except openai.BadRequestError as exc:
            answers.append(exc.code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    landed = [a for a in answers if not isinstance(a, str)]
    assert len(landed) == 3 and sorted(a for a in answers if isinstance(a, str)) == ["upload_size_exceeded"] * 5
    tenant = _tenant_of(live, upload.id)
    assert len(live.store.list(layout.upload_prefix(tenant, upload.id))) == 3
    done = sdk.uploads.complete(upload.id, part_ids=[p.id for p in landed])
    assert done.file.bytes == 300


def test_pending_uploads_per_tenant_are_capped_with_429(live, monkeypatch):
    monkeypatch.setattr(upload_service, "MAX_PENDING_UPLOADS", 2)
    sdk = live.sdk()
    for _ in range(2):
        sdk.uploads.create(bytes=3, filename="x.txt", mime_type="text/plain", purpose="user_data")
    response = httpx.post(f"{live.url}/v1/uploads", headers={"Authorization": f"Bearer {live.key_a}"},
                          json={"bytes": 3, "filename": "x.txt", "mime_type": "text/plain", "purpose": "user_data"})
    assert response.status_code == 429 and response.headers["Retry-After"] == "60"
    assert response.json()["error"]["code"] == "too_many_pending_uploads"
    live.sdk(live.key_b).uploads.create(bytes=3, filename="x.txt", mime_type="text/plain", purpose="user_data")
