"""GET /v1/fine_tuning/jobs/{id}/logs: the trainer's output the scheduler kept, scrubbed of the
platform's paths and credentials, bounded, per attempt, followed while the job runs, and only
for the job's own tenant."""

from __future__ import annotations

import hashlib
import secrets
import site
import sysconfig
import threading
import time

from sqlalchemy import select

from tests.helpers.platform import add_running_job
from tuneforge.db.tables import Attempt, Job
from tuneforge.services.training import trainer_logs
from tuneforge.services.training.trainer_logs import LogKeeper, Scrubber
from tuneforge.storage import layout


def _attempt(world, job_id: str, number: int, token: str) -> None:
    with world.platform.db.session() as session:
        session.add(Attempt(job_id=job_id, number=number, status="running", heartbeat_at=time.time(),
                            started_at=time.time(), token_hash=hashlib.sha256(token.encode()).hexdigest()))
        session.scalar(select(Job).where(Job.job_id == job_id)).attempt = number


def _raw_output(world, token: str) -> str:
    settings = world.platform.settings
    purelib = sysconfig.get_paths()["purelib"]
    return "".join([
        "INFO tuneforge.train: step 1/4 loss 2.3000\n",
        f"  File \"{purelib}/torch/nn/modules/module.py\", line 1, in _call_impl\n",
        f"loading {settings.home}/cache/base-models/abc/model.safetensors\n",
        f"writing {settings.resolved_storage_url}/tenants/x/jobs/y/checkpoints/step-2\n",
        "scratch in /tmp/tuneforge-prepare-q1w2e3/train.jsonl\n",
        f"callback with token {token} and Authorization: Bearer {token}\n",
        f"a key tf-{secrets.token_urlsafe(32)} leaked\n",
        f"user site {site.getusersitepackages()}/x.py\n",
        "INFO tuneforge.train: finished: 4 steps\n",
        "partial line being writ",
    ])


def test_the_log_is_scrubbed_bounded_and_only_the_jobs_tenants(world):
    key, tenant_id, job_id = add_running_job(world.platform, "gamma")
    token = secrets.token_urlsafe(32)
    _attempt(world, job_id, 1, token)
    keeper = LogKeeper(world.platform.settings, world.platform.store)
    raw = _raw_output(world, token)
    keeper.copy(raw, tenant_id=tenant_id, job_id=job_id, attempt=1,
                token_hash=hashlib.sha256(token.encode()).hexdigest(), final=False)
    headers = world.headers(key)

    answer = world.http.get(f"/v1/fine_tuning/jobs/{job_id}/logs", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain") and answer.headers["X-Attempt"] == "1"
    text = answer.text
    assert "step 1/4 loss 2.3000" in text and "finished: 4 steps" in text
    assert "partial line" not in text  # a line still being written waits for the next copy
    settings = world.platform.settings
    for secret_or_path in (token, str(settings.home), settings.resolved_storage_url, "/site-packages/",
                           sysconfig.get_paths()["purelib"], "/tmp/", "tf-" + raw.split("tf-")[1][:20]):
        assert secret_or_path not in text, secret_or_path
    assert "<site-packages>/torch/nn/modules/module.py" in text and "<home>/cache" in text
    assert "<store>/tenants/x" in text and "Bearer ***" in text

    assert world.http.get(f"/v1/fine_tuning/jobs/{job_id}/logs", params={"limit": 2}, headers=headers).text == \
        "user site <site-packages>/x.py\nINFO tuneforge.train: finished: 4 steps\n"
    tiny = world.http.get(f"/v1/fine_tuning/jobs/{job_id}/logs", params={"max_bytes": 40}, headers=headers).text
    assert tiny == "INFO tuneforge.train: finished: 4 steps\n"
    assert world.http.get(f"/v1/fine_tuning/jobs/{job_id}/logs", params={"limit": 0}, headers=headers).status_code \
        == 400
    # another tenant's job, an attempt the job never had: 404
    assert world.http.get(f"/v1/fine_tuning/jobs/{job_id}/logs", headers=world.headers(world.key_a)).status_code \
        == 404
    assert world.http.get(f"/v1/fine_tuning/jobs/{job_id}/logs", params={"attempt": 2},
                          headers=headers).status_code == 404


def test_a_full_window_drops_its_cut_first_line():
    class Store(dict):
        def put_bytes(self, key, data):
            self[key] = data

    store = Store()
    tail = "x" * (trainer_logs.LOG_KEEP_BYTES - 10) + "\nkept line\n"
    trainer_logs.keep(store, Scrubber(()), tail, tenant_id="t", job_id="j", attempt=1, token_hash="", final=True)
    assert store[layout.trainer_log_key("t", "j", 1)] == b"kept line\n"


def test_follow_sends_new_lines_until_the_job_has_ended(world, monkeypatch):
    monkeypatch.setattr(trainer_logs, "FOLLOW_POLL_S", 0.05)
    monkeypatch.setattr(trainer_logs, "SYNC_INTERVAL_S", 0.05)
    key, tenant_id, job_id = add_running_job(world.platform, "delta")
    _attempt(world, job_id, 1, "t" * 43)
    store = world.platform.store
    log_key = layout.trainer_log_key(tenant_id, job_id, 1)
    store.put_bytes(log_key, b"line 1\n")

    def trainer() -> None:
        for n in range(2, 5):
            time.sleep(0.2)
            store.put_bytes(log_key, "".join(f"line {i}\n" for i in range(1, n + 1)).encode())
        with world.platform.db.session() as session:
            session.scalar(select(Job).where(Job.job_id == job_id)).status = "succeeded"

    writer = threading.Thread(target=trainer)
    writer.start()
    with world.http.stream("GET", f"/v1/fine_tuning/jobs/{job_id}/logs", params={"follow": "true"},
                           headers=world.headers(key)) as answer:
        assert answer.status_code == 200
        received = "".join(answer.iter_text())
    writer.join()
    assert received == "line 1\nline 2\nline 3\nline 4\n"
    assert world.platform.streams.open_streams(tenant_id) == 0  # the follower's stream slot came back


def test_the_platforms_own_credentials_and_node_folders_are_scrubbed(tmp_path):
    from tuneforge.settings import Settings

    settings = Settings(home=tmp_path / "home", storage_url="s3://bucket/objects", s3_endpoint_url="http://minio:9000",
                        s3_access_key_id="AKIAEXAMPLEKEY", s3_secret_access_key="wJalrXUtnFEMI/K7MDENG",
                        admin_api_key="operator-admin-key", ray_node_workdir="/srv/ray/{node_id}/work")
    text = Scrubber.from_settings(settings).scrub(
        "env AKIAEXAMPLEKEY wJalrXUtnFEMI/K7MDENG operator-admin-key\n"
        "GET http://minio:9000/bucket/objects/tenants/t/x from /srv/ray/n1/work/job/rank-0.log\n")
    for secret_or_path in ("AKIAEXAMPLEKEY", "wJalrXUtnFEMI", "operator-admin-key", "minio:9000", "/srv/ray",
                           "s3://bucket"):
        assert secret_or_path not in text, secret_or_path
    assert "<store-endpoint>/bucket/objects/tenants/t/x" in text and "<node>n1/work" in text
