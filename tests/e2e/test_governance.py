"""Governance through a running plane: the audit log tells a tiny job's whole life, and deleting its
tenant leaves no object under the tenant's prefix and no row but billing and audit, the other
tenant untouched."""

from __future__ import annotations

import hashlib
import io
import json
import re
import sysconfig

import httpx
import pytest

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import wait_for
from tests.helpers.net import wait_until
from tuneforge.db.repos import attempts as attempt_repo
from tuneforge.db.repos import tenant_data
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.demo.dataset import demo_examples
from tuneforge.storage import layout

pytestmark = pytest.mark.e2e
ADMIN_KEY = "governance-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def plane(tmp_path, database_url, tiny_model_dir):
    world = start_plane(tmp_path, database_url, tiny_model_dir, admin_api_key=ADMIN_KEY)
    yield world
    world.close()


def tiny_job(plane, key: str):
    sdk = plane.sdk(key)
    data = "".join(json.dumps(row) + "\n" for row in demo_examples(n_keys=12)).encode()
    training = sdk.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune").id
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training, seed=0, suffix="audit",
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 0.1}}})
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    return done, training


def audit(plane, **params) -> list[dict]:
    answer = httpx.get(f"{plane.url}/v1/admin/audit", params={"limit": 100, **params}, headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def check_trainer_log(plane, job_id: str) -> None:
    """The tenant reads its trainer's lines, and nothing of the platform's paths or the job token."""
    url = f"{plane.url}/v1/fine_tuning/jobs/{job_id}/logs"
    auth = {"Authorization": f"Bearer {plane.key_a}"}

    def text() -> str:
        answer = httpx.get(url, headers=auth, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.text

    try:  # the scheduler's last copy is made once the trainer's process is gone
        wait_until(lambda: "finished:" in text(), 60, "the trainer's last lines to be kept")
    except AssertionError:
        print(text())  # what was kept, to tell which lines are missing
        raise
    log = text()
    assert re.search(r"step \d+/\d+ loss", log)
    settings = plane.plane.platform.settings
    for path in (str(settings.home), str(settings.home.resolve()), settings.resolved_storage_url,
                 sysconfig.get_paths()["purelib"], "/site-packages/", "/tmp/"):
        assert path not in log, path
    with plane.plane.platform.db.session() as session:
        hashed = {a.token_hash for a in attempt_repo.for_job(session, plane_tenant(plane, "acme"), job_id)}
    assert hashed and not any(hashlib.sha256(m.encode()).hexdigest() in hashed
                              for m in re.findall(r"[A-Za-z0-9_-]{43}", log))
    assert httpx.get(url, headers={"Authorization": f"Bearer {plane.key_b}"}, timeout=30).status_code == 404
    followed = httpx.get(url, params={"follow": "true"}, headers=auth, timeout=60)  # the job has ended: it closes
    assert followed.status_code == 200 and "finished:" in followed.text


def plane_tenant(plane, name: str) -> str:
    with plane.plane.platform.db.session() as session:
        return tenant_repo.by_name(session, name).tenant_id


@pytest.mark.both_executors
def test_the_audit_log_tells_a_jobs_life_and_its_tenants_deletion(plane):
    done, training = tiny_job(plane, plane.key_a)
    check_trainer_log(plane, done.id)
    life = audit(plane, resource_id=done.id)
    # every state, in order, as the platform moved the job; the request that created it, by its caller
    assert [row["action"] for row in life if row["actor"] == "platform"] == [
        "job.validating_files", "job.queued", "job.running", "job.succeeded"]
    created = [row for row in life if row["actor"] == "tenant"]
    assert [row["action"] for row in created] == ["create_job"]
    assert created[0]["key_id"] and created[0]["request_id"].startswith("req_") and created[0]["status_code"] == 200
    assert life[0]["created_at"] <= created[0]["created_at"] <= life[-1]["created_at"]
    assert [row["action"] for row in audit(plane, resource_id=training)] == ["create_file"]
    assert [row["action"] for row in audit(plane, resource_id=done.fine_tuned_model)] == ["model.registered"]

    store, db = plane.plane.platform.store, plane.plane.platform.db
    with db.session() as session:
        acme = tenant_repo.by_name(session, "acme").tenant_id
        globex = tenant_repo.by_name(session, "globex").tenant_id
    sdk_b = plane.sdk(plane.key_b)
    kept_file = sdk_b.files.create(file=("b.jsonl", io.BytesIO(b'{"prompt": "a", "completion": "b"}\n')),
                                   purpose="fine-tune").id
    kept_objects = store.list(layout.tenant_prefix(globex))
    assert store.list(layout.tenant_prefix(acme)) and kept_objects

    deleted = httpx.delete(f"{plane.url}/v1/admin/tenants/acme", headers=ADMIN, timeout=60)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["status"] == "deleted"
    assert store.list(layout.tenant_prefix(acme)) == []
    with db.session() as session:
        assert set(tenant_data.remaining(session, acme).values()) == {0}
    assert store.list(layout.tenant_prefix(globex)) == kept_objects
    assert sdk_b.files.retrieve(kept_file).id == kept_file
    assert httpx.get(f"{plane.url}/v1/files", headers={"Authorization": f"Bearer {plane.key_a}"}).status_code == 401
    actions = [row["action"] for row in audit(plane, tenant="acme")]
    assert actions[-3:] == ["tenant.export", "tenant.purge", "delete_tenant"]
    assert "job.succeeded" in actions  # kept through the deletion
