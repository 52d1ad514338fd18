"""A tenant's whole job under envelope encryption (TUNEFORGE_ENCRYPT_TENANT_OBJECTS): the trainer
reads its sealed data and writes its checkpoints and adapter through the control plane's object
proxy, never holding a key; everything of the tenant's in the store is sealed; the fine-tuned model
answers and downloads; once the tenant's data key is revoked, its adapter no longer opens while
another tenant's job still trains."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import create_demo_job, wait_for
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.security.crypto import new_key
from tuneforge.services.tenancy.data_keys import TenantKeyRing
from tuneforge.storage.envelope import MAGIC, EncryptingStore

pytestmark = pytest.mark.e2e


@pytest.mark.both_executors
def test_a_job_trains_on_sealed_data_and_a_revoked_key_leaves_nothing_readable(tmp_path: Path, database_url,
                                                                                tiny_model_dir) -> None:
    world = start_plane(tmp_path, database_url, tiny_model_dir, encrypt_tenant_objects=True,
                        secrets_key=new_key())
    try:
        store = world.plane.platform.store
        assert isinstance(store, EncryptingStore)
        sdk = world.sdk(world.key_a)
        job, files = create_demo_job(sdk, tmp_path, {"n_epochs": 20})
        done = wait_for(sdk, job.id)
        assert done.status == "succeeded", done.error
        key = files.examples[0]["messages"][1]["content"]
        reply = sdk.chat.completions.create(model=done.fine_tuned_model, max_tokens=8, messages=[
            {"role": "system", "content": files.examples[0]["messages"][0]["content"]},
            {"role": "user", "content": key}])
        assert reply.choices[0].message.content  # the serving engine opened the sealed adapter

        with world.plane.platform.db.session() as session:
            tenant_id = tenant_repo.by_name(session, "acme").tenant_id
        own = [k for k in store.list(f"tenants/{tenant_id}") if not k.endswith("/.complete")]
        assert any("/checkpoints/" in k for k in own) and any("/artifacts/adapter/" in k for k in own)
        unsealed = [k for k in own if not FsspecRaw(store).head(k).startswith(MAGIC)]
        assert unsealed == [], unsealed  # what the trainer wrote through the proxy is sealed too

        adapter = f"{world.url}/v1/fine_tuning/jobs/{job.id}/download?artifact=adapter"
        headers = {"Authorization": f"Bearer {world.key_a}"}
        assert httpx.get(adapter, headers=headers, timeout=60).status_code == 200

        TenantKeyRing(world.plane.platform.db, world.plane.platform.sealer).revoke(tenant_id)
        store.keys = TenantKeyRing(world.plane.platform.db, world.plane.platform.sealer)  # this process forgets
        refused = httpx.get(adapter, headers=headers, timeout=60)
        assert refused.status_code == 410 and refused.json()["error"]["code"] == "data_key_revoked"

        other = world.sdk(world.key_b)  # another tenant trains on as before
        theirs, _ = create_demo_job(other, tmp_path / "b", {"n_epochs": 2})
        assert wait_for(other, theirs.id).status == "succeeded"
    finally:
        world.close()


class FsspecRaw:
    """The stored bytes of an object, under the store's encryption."""

    def __init__(self, store: EncryptingStore) -> None:
        self.store = store

    def head(self, key: str) -> bytes:
        with self.store.fs.open(self.store._path(key), "rb") as handle:
            return handle.read(len(MAGIC))
