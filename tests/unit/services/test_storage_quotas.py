"""Storage quotas by tier (services/tenancy/quotas.py, settings `storage_quotas`): files' bytes (403), one
object larger than the whole quota (413), pending uploads and their declared bytes (429 with
Retry-After), artifacts' bytes at job create and resume (403)."""

from __future__ import annotations

import io
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, fake_model_dir, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FileRow, UploadRow
from tuneforge.services.tenancy import quotas
from tuneforge.settings import Settings
from tuneforge.settings.money import DEFAULT_STORAGE_QUOTAS
from tuneforge.storage import layout

FILE_QUOTA = 10_000
QUOTAS = {"free": {"file_bytes": FILE_QUOTA, "pending_upload_bytes": 5_000, "pending_uploads": 2,
                   "artifact_bytes": 1_000}}


@pytest.fixture
def world(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, storage_quotas=QUOTAS)
    add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    key = add_tenant(platform, "frugal", "free")
    other = add_tenant(platform, "other", "free")
    yield platform, http, {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {other}"}
    http.close()
    platform.db.dispose()


def _upload(http: TestClient, headers: dict, size_bytes: int, purpose: str = "user_data"):
    return http.post("/v1/files", headers=headers, data={"purpose": purpose},
                     files={"file": ("notes.txt", io.BytesIO(b"x" * size_bytes), "text/plain")})


def _files_of(platform, name: str) -> tuple[int, int]:
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, name).tenant_id
        count = session.scalar(select(func.count()).select_from(FileRow).where(FileRow.tenant_id == tenant_id))
        objects = platform.store.list(f"{layout.tenant_prefix(tenant_id)}/files")
        return count, len(objects)


def test_every_tier_has_storage_quotas_and_a_tier_may_change_some_fields():
    defaults = Settings()
    for tier in DEFAULT_STORAGE_QUOTAS:
        quota = defaults.storage_quota(tier)
        assert None not in (quota.file_bytes, quota.pending_upload_bytes, quota.pending_uploads, quota.artifact_bytes)
    assert defaults.storage_quota("free").file_bytes < defaults.storage_quota("standard").file_bytes
    changed = Settings(storage_quotas={"free": {"file_bytes": 5, "artifact_bytes": None}})
    assert changed.storage_quota("free").file_bytes == 5 and changed.storage_quota("free").artifact_bytes is None
    assert changed.storage_quota("free").pending_uploads == DEFAULT_STORAGE_QUOTAS["free"]["pending_uploads"]
    assert changed.storage_quota("no-such-tier") == changed.storage_quota("free")
    with pytest.raises(ValueError, match="unknown tier"):
        Settings(storage_quotas={"gold": {}})


def test_files_past_the_quota_answer_403_and_leave_no_bytes(world):
    platform, http, headers, other = world
    assert _upload(http, headers, 6_000).status_code == 200
    refused = _upload(http, headers, 4_001)  # 10_001 > 10_000
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["type"] == "insufficient_quota" and error["code"] == "storage_quota_exceeded"
    assert "6000" in error["message"] and "10000" in error["message"]
    assert _files_of(platform, "frugal") == (1, 1)  # the refused file's bytes are gone too
    assert _upload(http, headers, 4_000).status_code == 200  # exactly the quota fits
    assert _upload(http, other, 6_000).status_code == 200  # another tenant has its own quota


def test_one_file_larger_than_the_whole_quota_is_413(world):
    platform, http, headers, _other = world
    refused = _upload(http, headers, FILE_QUOTA + 1)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "file_too_large"
    assert _files_of(platform, "frugal") == (0, 0)


def test_deleting_files_makes_room_again(world):
    _platform, http, headers, _other = world
    first = _upload(http, headers, 8_000).json()["id"]
    assert _upload(http, headers, 8_000).status_code == 403
    assert http.delete(f"/v1/files/{first}", headers=headers).status_code == 200
    assert _upload(http, headers, 8_000).status_code == 200


def _declare(http: TestClient, headers: dict, size_bytes: int):
    return http.post("/v1/uploads", headers=headers, json={"filename": "notes.txt", "purpose": "user_data",
                                                           "bytes": size_bytes, "mime_type": "text/plain"})


def test_pending_uploads_are_bounded_in_number_and_declared_bytes(world):
    platform, http, headers, other = world
    assert _declare(http, headers, 3_000).status_code == 200
    over_bytes = _declare(http, headers, 2_001)  # 5_001 declared > 5_000
    assert over_bytes.status_code == 429, over_bytes.text
    assert over_bytes.json()["error"]["code"] == "pending_upload_bytes_exceeded"
    assert 1 <= int(over_bytes.headers["Retry-After"]) <= 3600  # until the oldest pending upload expires
    second = _declare(http, headers, 2_000)
    assert second.status_code == 200
    over_count = _declare(http, headers, 1)
    assert over_count.status_code == 429 and over_count.json()["error"]["code"] == "too_many_pending_uploads"
    assert _declare(http, other, 3_000).status_code == 200  # the other tenant is not held up
    assert http.post(f"/v1/uploads/{second.json()['id']}/cancel", headers=headers).status_code == 200
    assert _declare(http, headers, 2_000).status_code == 200  # cancelling made room
    too_large = _declare(http, headers, 5_001)  # more than the pending quota alone: never fits
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "file_too_large"
    with platform.db.session() as session:
        assert session.scalar(select(func.count()).select_from(UploadRow)) == 4


def test_an_upload_that_would_not_fit_the_files_quota_is_refused_at_create(world):
    _platform, http, headers, _other = world
    assert _upload(http, headers, 9_000).status_code == 200
    refused = _declare(http, headers, 2_000)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "storage_quota_exceeded"


def test_completing_an_upload_counts_against_the_files_quota(world):
    _platform, http, headers, _other = world
    upload = _declare(http, headers, 3_000).json()["id"]
    part = http.post(f"/v1/uploads/{upload}/parts", headers=headers,
                     files={"data": ("p", io.BytesIO(b"y" * 3_000))}).json()["id"]
    assert _upload(http, headers, 8_000).status_code == 200  # the quota is used meanwhile
    done = http.post(f"/v1/uploads/{upload}/complete", headers=headers, json={"part_ids": [part]})
    assert done.status_code == 403 and done.json()["error"]["code"] == "storage_quota_exceeded"
    assert http.get(f"/v1/uploads/{upload}", headers=headers).json()["status"] == "pending"  # nothing lost


def test_artifacts_past_the_quota_refuse_a_new_job(world):
    platform, http, headers, _other = world
    training = http.post("/v1/files", headers=headers, data={"purpose": "fine-tune"},
                         files={"file": ("train.jsonl", io.BytesIO(chat_lines(20)))}).json()["id"]
    body = {"model": "tiny-base", "training_file": training}
    with platform.db.session() as session:
        tenant = tenant_repo.by_name(session, "frugal")
        assert quotas.artifact_bytes(platform.store, tenant.tenant_id) == 0
        platform.store.put_bytes(layout.checkpoint_prefix(tenant.tenant_id, "ftjob-old", 10) + "/w.bin", b"w" * 1_000)
        assert quotas.artifact_bytes(platform.store, tenant.tenant_id) == 1_000
    refused = http.post("/v1/fine_tuning/jobs", headers=headers, json=body)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "storage_quota_exceeded"
    with platform.db.session() as session:
        platform.store.delete_prefix(layout.tenant_jobs_prefix(tenant_repo.by_name(session, "frugal").tenant_id))
    assert http.post("/v1/fine_tuning/jobs", headers=headers, json=body).status_code == 200


def test_pending_uploads_figures_skip_expired_and_ended_ones(world):
    platform, http, headers, _other = world
    first = _declare(http, headers, 1_000).json()["id"]
    _declare(http, headers, 2_000)
    with platform.db.session() as session:
        session.scalar(select(UploadRow).where(UploadRow.upload_id == first)).expires_at = int(time.time()) - 1
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "frugal").tenant_id
        pending = quotas.pending_uploads(session, tenant_id, time.time())
    assert (pending.count, pending.declared_bytes) == (1, 2_000)
    assert pending.next_expiry is not None and pending.next_expiry > time.time()


def test_usage_shows_storage_against_the_quotas(world):
    _platform, http, headers, _other = world
    _upload(http, headers, 3_000)
    _declare(http, headers, 1_500)
    storage = http.get("/v1/usage", headers=headers).json()["storage"]
    assert storage == {"file_bytes": 3_000, "file_bytes_quota": FILE_QUOTA, "pending_uploads": 1,
                       "pending_uploads_quota": 2, "pending_upload_bytes": 1_500,
                       "pending_upload_bytes_quota": 5_000, "artifact_bytes": 0, "artifact_bytes_quota": 1_000}
