"""Tenants' objects under envelope encryption (TUNEFORGE_ENCRYPT_TENANT_OBJECTS), through the
API: what the store holds is sealed, what the tenant reads back is its own bytes, and after the
tenant's data key is revoked its data answers 410, never a 500, while another tenant's reads on."""

from __future__ import annotations

import io
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_tenant, chat_lines, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.security.crypto import new_key
from tuneforge.services.tenancy.data_keys import TenantKeyRing
from tuneforge.storage.envelope import MAGIC, EncryptingStore, KeyUnavailable


@pytest.fixture
def sealed_world(tmp_path: Path, database_url: str):
    platform = make_platform(tmp_path, database_url, secrets_key=new_key(), encrypt_tenant_objects=True)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    keys = {name: add_tenant(platform, name) for name in ("alpha", "beta")}
    yield platform, http, keys
    http.close()
    platform.db.dispose()


def sdk(http: TestClient, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0)


def stored_objects(root: Path, tenant_prefix: str) -> list[Path]:
    return [path for path in (root / tenant_prefix).rglob("*") if path.is_file()]


def test_uploads_are_sealed_at_rest_validated_and_read_back_plain(sealed_world, tmp_path: Path) -> None:
    platform, http, keys = sealed_world
    alpha = sdk(http, keys["alpha"])
    data = chat_lines(40, prefix="the secret question")
    created = alpha.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert created.status == "processed", created.status_details
    assert alpha.files.content(created.id).read() == data

    # the Uploads API: parts sealed one by one, the file their frames one after another
    upload = alpha.uploads.create(bytes=len(data), filename="big.jsonl", mime_type="application/jsonl",
                                  purpose="fine-tune")
    half = len(data) // 2
    parts = [alpha.uploads.parts.create(upload.id, data=piece).id for piece in (data[:half], data[half:])]
    done = alpha.uploads.complete(upload.id, part_ids=parts)
    assert done.file is not None and done.file.status == "processed"
    assert alpha.files.content(done.file.id).read() == data

    root = Path(platform.store.url)
    objects = stored_objects(root, "tenants")
    assert objects
    for path in objects:  # every object of the tenant, the validation report included, is sealed
        body = path.read_bytes()
        assert body.startswith(MAGIC), path
        assert b"secret question" not in body


def test_a_revoked_tenant_key_answers_410_and_leaves_other_tenants_alone(sealed_world) -> None:
    platform, http, keys = sealed_world
    alpha, beta = sdk(http, keys["alpha"]), sdk(http, keys["beta"])
    mine = alpha.files.create(file=("a.jsonl", io.BytesIO(chat_lines(3))), purpose="fine-tune")
    theirs = beta.files.create(file=("b.jsonl", io.BytesIO(chat_lines(4))), purpose="fine-tune")
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "alpha").tenant_id
    assert TenantKeyRing(platform.db, platform.sealer).revoke(tenant_id) == 1
    platform.store.keys = TenantKeyRing(platform.db, platform.sealer)  # this process's cache forgets too

    answer = http.get(f"/v1/files/{mine.id}/content", headers={"Authorization": f"Bearer {keys['alpha']}"})
    assert answer.status_code == 410
    assert answer.json()["error"]["code"] == "data_key_revoked"
    assert "Traceback" not in answer.text and "/" not in answer.json()["error"]["message"].split("(")[0]
    assert beta.files.content(theirs.id).read() == chat_lines(4)


def test_deleting_a_tenant_erases_its_data_key_so_a_copy_of_its_objects_no_longer_opens(tmp_path: Path,
                                                                                       database_url: str) -> None:
    platform = make_platform(tmp_path, database_url, secrets_key=new_key(), encrypt_tenant_objects=True,
                             admin_api_key="enc-admin")
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    try:
        admin = {"Authorization": "Bearer enc-admin"}
        created = http.post("/v1/admin/tenants", json={"name": "gone"}, headers=admin).json()
        gone = sdk(http, created["api_key"])
        uploaded = gone.files.create(file=("a.jsonl", io.BytesIO(chat_lines(5))), purpose="fine-tune")
        root = Path(platform.store.url)
        backup = tmp_path / "backup"  # what a bucket backup or replica would hold
        for path in stored_objects(root, f"tenants/{created['id']}"):
            target = backup / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        assert uploaded.status == "processed"

        answer = http.delete("/v1/admin/tenants/gone", headers=admin)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "deleted" and answer.json()["data_keys_erased"] == 1
        restored = EncryptingStore(str(backup), keys=TenantKeyRing(platform.db, platform.sealer))
        copied = restored.list(f"tenants/{created['id']}")
        assert copied
        for key in copied:
            with pytest.raises(KeyUnavailable, match="revoked"):
                restored.get_bytes(key)
    finally:
        http.close()
        platform.db.dispose()
