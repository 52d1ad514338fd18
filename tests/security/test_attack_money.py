"""Attacks on the operator's money against a real server (`tuneforge up`, two API workers): pause →
create → resume past the queue cap, files past the storage quota, a flood of pending uploads,
bad `evals` files, and a flood of estimates. Each must be refused with the right status while
the server's memory and the other tenant's latency stay within the bounds stated here.

The attacker is on the free tier with `max_concurrent_jobs` 0 (its jobs wait, none trains: the
attacks are about what is admitted, and a training run would only add noise to the bystander's
latency) and a files quota of `FILE_QUOTA_BYTES` (the tier's other storage quotas are the
defaults: 10 pending uploads declaring at most 1 GiB). Figures before and after the fix are in
the module's `test_*` docstrings' units: counts, bytes, seconds."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.attack import MODEL_NAME, LiveServer
from tests.helpers.files import processed_over_http
from tests.helpers.platform import chat_lines, make_platform
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.storage import layout

FILE_QUOTA_BYTES = 8 * 1024 * 1024
# bounds on what an attack may cost the others (a loaded 2-core CI machine; far below "before").
# The memory bound leaves room for the process a fine-tune upload's check runs in (about 300 MiB
# while it lives, services/datasets.check_in_worker): the attacks upload training files.
MAX_RSS_GROWTH_BYTES = 512 * 1024 * 1024
MAX_BYSTANDER_S = 3.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> Iterator[LiveServer]:
    quotas = {"free": {"file_bytes": FILE_QUOTA_BYTES}}
    server = LiveServer.start(tmp_path_factory.mktemp("live-money"), tiny_model_dir,
                              env={"TUNEFORGE_STORAGE_QUOTAS": json.dumps(quotas)})
    try:
        _suspend(server, "attacker")
        _suspend(server, "bystander")
        _warm_up(server)
        yield server
    finally:
        server.stop()


def _warm_up(server: LiveServer) -> None:
    """What the first job create and estimate of an API worker load (the tokenizer, the data
    checks' imports) is the server's start-up, not an attack's cost: done before any watch, by the
    bystander, often enough to reach both workers."""
    with server.client(server.bystander_key) as client:
        paced = _Paced(client)
        training = processed_over_http(paced, {}, _upload(paced, chat_lines(20), "fine-tune").json())["id"]
        for seed in range(4):
            job = client.post("/v1/fine_tuning/jobs", json={"model": MODEL_NAME, "training_file": training})
            client.post(f"/v1/fine_tuning/jobs/{job.json()['id']}/cancel")
            client.post("/v1/fine_tuning/jobs/estimate",
                        json={"model": MODEL_NAME, "training_file": training, "seed": seed})


def _suspend(server: LiveServer, name: str) -> None:
    """The tenant's jobs may wait but never start (max_concurrent_jobs 0)."""
    database_url = f"sqlite:///{(server.home / 'tuneforge.db').resolve()}"
    platform = make_platform(server.home.parent, database_url)
    try:
        with platform.db.session() as session:
            tenant_service.set_quota(session, name, {"max_concurrent_jobs": 0})
    finally:
        platform.db.dispose()


class _Paced:
    """The attacker's client as the openai SDK behaves: a 429 of the request-rate limiter is waited
    out (Retry-After) and sent again, so what an attack meets is the quota under test."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        for _ in range(50):
            answer = self._client.request(method, url, **kwargs)
            code = answer.json().get("error", {}).get("code") if answer.status_code == 429 else None
            if code not in ("rate_limit_exceeded", "concurrency_limit_exceeded"):
                return answer
            time.sleep(float(answer.headers.get("retry-after", "1")))
        return answer

    def get(self, url: str, **kwargs) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)


@contextlib.contextmanager
def _attacker(live: LiveServer, timeout_s: float = 120.0) -> Iterator[_Paced]:
    with live.client(live.attacker_key, timeout_s=timeout_s) as client:
        yield _Paced(client)


def _upload(client: _Paced, data: bytes, purpose: str, name: str = "train.jsonl") -> httpx.Response:
    return client.post("/v1/files", data={"purpose": purpose}, files={"file": (name, io.BytesIO(data))})


def _contained(live: LiveServer, watch) -> None:  # noqa: ANN001 - a Watch
    assert live.alive(), live.log()[-3000:]
    assert not watch.bystander_failures, watch.bystander_failures[:3]
    assert watch.rss_growth_bytes < MAX_RSS_GROWTH_BYTES, watch.summary()
    assert watch.bystander_max_s < MAX_BYSTANDER_S, watch.summary()


def pause_create_resume(live: LiveServer, rounds: int = 4) -> dict:
    """Create up to the queue cap, pause them all, create again, ... then resume every paused job.
    Returns how many jobs end up waiting (queued or validating) and the resume answers' statuses."""
    with _attacker(live) as client:
        training = processed_over_http(client, {}, _upload(client, chat_lines(20), "fine-tune").json())["id"]
        body = {"model": MODEL_NAME, "training_file": training}
        paused = []
        for _ in range(rounds):
            created = [client.post("/v1/fine_tuning/jobs", json=body) for _ in range(3)]
            for answer in created:
                if answer.status_code == 200:
                    job_id = answer.json()["id"]
                    if client.post(f"/v1/fine_tuning/jobs/{job_id}/pause").status_code == 200:
                        paused.append(job_id)
        created = [client.post("/v1/fine_tuning/jobs", json=body).status_code for _ in range(3)]
        resumed = [client.post(f"/v1/fine_tuning/jobs/{job_id}/resume").status_code for job_id in paused]
        jobs = client.get("/v1/fine_tuning/jobs", params={"limit": 100}).json()["data"]
        waiting = sum(job["status"] in ("queued", "validating_files") for job in jobs)
        for job in jobs:  # leave nothing waiting for the next attack
            if job["status"] not in ("cancelled", "failed", "succeeded"):
                client.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel")
    return {"waiting": waiting, "created": created, "resumed": resumed}


def test_pause_create_resume_stays_under_the_queue_cap(live):
    """Before: 15 jobs waiting for a cap of 3 (every resume 200). After: 3, resumes past it 429."""
    with live.watch() as watch:
        figures = pause_create_resume(live)
    assert figures["waiting"] == 3, figures
    assert figures["resumed"].count(200) + figures["created"].count(200) == 3
    assert set(figures["resumed"]) <= {200, 429}
    _contained(live, watch)


def files_past_quota(live: LiveServer, count: int = 12, size_bytes: int = 1024 * 1024) -> dict:
    """`count` files of `size_bytes` (purpose user_data): the statuses, and the bytes the tenant holds."""
    with _attacker(live) as client:
        statuses = [_upload(client, b"x" * size_bytes, "user_data", "blob.bin").status_code for _ in range(count)]
        listed = client.get("/v1/files", params={"limit": 1000}).json()["data"]
        held = sum(f["bytes"] for f in listed if f["purpose"] == "user_data")
        for item in listed:
            if item["purpose"] == "user_data":
                client.delete(f"/v1/files/{item['id']}")
    return {"statuses": statuses, "held_bytes": held}


def test_files_past_the_storage_quota_are_403(live):
    """Before: 12 MiB stored of an 8 MiB quota (all 200). After: 8 stored, the rest 403."""
    with live.watch() as watch:
        figures = files_past_quota(live)
    statuses = figures["statuses"]
    accepted = statuses.count(200)  # the earlier attacks' small training files use a little of the quota
    assert statuses == [200] * accepted + [403] * (len(statuses) - accepted) and accepted in (7, 8), figures
    assert figures["held_bytes"] <= FILE_QUOTA_BYTES
    _contained(live, watch)


def test_parallel_uploads_cannot_race_past_the_quota(live):
    """12 uploads of 1 MiB, 6 at a time over both API workers: the quota is counted under the
    tenant's lock, so at most 8 MiB is ever kept."""
    with live.watch() as watch, _attacker(live) as client:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(lambda _i: _upload(client, b"z" * 1024 * 1024, "user_data", "r.bin").status_code,
                                     range(12)))
        listed = client.get("/v1/files", params={"limit": 1000}).json()["data"]
        held = sum(f["bytes"] for f in listed)
        for item in listed:
            if item["purpose"] == "user_data":
                client.delete(f"/v1/files/{item['id']}")
    assert set(statuses) == {200, 403} and statuses.count(200) in (7, 8), statuses
    assert held <= FILE_QUOTA_BYTES
    _contained(live, watch)


def pending_upload_flood(live: LiveServer, count: int = 100) -> dict:
    """`count` uploads each declaring the free tier's largest file (256 MiB), none sent."""
    declared = 256 * 1024 * 1024
    with _attacker(live) as client:
        answers = [client.post("/v1/uploads", json={"filename": "big.jsonl", "purpose": "user_data",
                                                    "bytes": declared, "mime_type": "text/plain"})
                   for _ in range(count)]
        accepted = [a.json()["id"] for a in answers if a.status_code == 200]
        for upload_id in accepted:
            client.post(f"/v1/uploads/{upload_id}/cancel")
    refused = [a for a in answers if a.status_code != 200]
    return {"accepted": len(accepted), "declared_bytes": len(accepted) * declared,
            "refused_statuses": sorted({a.status_code for a in refused}),
            "retry_after": sorted({a.headers.get("retry-after") for a in refused if a.status_code == 429})}


def test_pending_uploads_are_bounded(live):
    """Before: 100 pending uploads declaring 25 GiB. After: 4 (1 GiB declared), then 429 with Retry-After
    (but 413 here: the attacker's 8 MiB files quota refuses a 256 MiB upload outright)."""
    with live.watch() as watch:
        figures = pending_upload_flood(live)
    assert figures["accepted"] == 0 and figures["refused_statuses"] == [413], figures
    _contained(live, watch)


def test_pending_upload_count_answers_429_with_retry_after(live):
    """Before: every upload accepted. After: the free tier's 10 pending uploads, then 429 until the
    oldest one expires (Retry-After, at most the upload's hour)."""
    with live.watch() as watch, _attacker(live) as client:
        answers = [client.post("/v1/uploads", json={"filename": "b.jsonl", "purpose": "user_data",
                                                    "bytes": 1024 * 1024, "mime_type": "text/plain"})
                   for _ in range(12)]
        for answer in answers:
            if answer.status_code == 200:
                client.post(f"/v1/uploads/{answer.json()['id']}/cancel")
    statuses = [a.status_code for a in answers]
    assert statuses == [200] * 10 + [429] * 2, statuses
    assert answers[-1].json()["error"]["code"] == "too_many_pending_uploads"
    assert 1 <= int(answers[-1].headers["retry-after"]) <= 3600
    _contained(live, watch)


def bad_evals_files(live: LiveServer, extra: int = 40) -> dict:
    """A binary evals file, then `extra` good ones, then a fine-tune upload: the statuses."""
    good = (json.dumps({"prompt": "2+2=", "completion": "4"}) + "\n").encode()
    with _attacker(live) as client:
        binary = _upload(client, b"\x00\xff\xfe" * 2000, "evals", "set.jsonl").status_code
        many = [_upload(client, good, "evals", f"set{i}.jsonl").status_code for i in range(extra)]
        after = _upload(client, chat_lines(20), "fine-tune").status_code
        for item in client.get("/v1/files", params={"limit": 1000}).json()["data"]:
            if item["purpose"] == "evals":
                client.delete(f"/v1/files/{item['id']}")
    return {"binary": binary, "evals_accepted": many.count(200), "evals_refused": sorted(set(many) - {200}),
            "later_upload": after}


def test_bad_evals_files_are_400s_and_never_break_later_uploads(live):
    """Before: the binary file 200 and the later fine-tune upload 500 (past 64 evals files too).
    After: the binary file 400, 32 evals files at most (400 past them), the later upload 200."""
    with live.watch() as watch:
        figures = bad_evals_files(live)
    assert figures["binary"] == 400 and figures["later_upload"] == 200, figures
    assert figures["evals_accepted"] == 32 and figures["evals_refused"] == [400], figures
    _contained(live, watch)


def _datasets_bytes(live: LiveServer, tenant: str = "attacker") -> int:
    """Bytes of the prepared datasets the tenant has in the store."""
    database_url = f"sqlite:///{(live.home / 'tuneforge.db').resolve()}"
    platform = make_platform(live.home.parent, database_url)
    try:
        with platform.db.session() as session:
            tenant_id = tenant_repo.by_name(session, tenant).tenant_id
        keys = platform.store.list(f"{layout.tenant_prefix(tenant_id)}/datasets")
        return sum(platform.store.size_bytes(key) for key in keys)
    finally:
        platform.db.dispose()


def estimate_flood(live: LiveServer, requests: int = 16, threads: int = 4) -> dict:
    """Estimates of distinct bodies (each a data pass before the fix) sent `threads` at a time, then
    the training file deleted: the statuses, the time taken and what the flood left in the tenant's
    datasets folder."""
    before_bytes = _datasets_bytes(live)
    started = time.monotonic()
    with _attacker(live, timeout_s=300) as client:
        training = processed_over_http(client, {}, _upload(client, chat_lines(2000), "fine-tune").json())["id"]

        def one(seed: int) -> httpx.Response:
            # a distinct max_seq_length makes a distinct prepared dataset: a whole data pass each
            return client.post("/v1/fine_tuning/jobs/estimate", json={
                "model": MODEL_NAME, "training_file": training, "hyperparameters": {"max_seq_length": 200 + seed}})

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            answers = list(pool.map(one, range(requests)))
        client.delete(f"/v1/files/{training}")
    return {"statuses": [a.status_code for a in answers], "left_bytes": _datasets_bytes(live) - before_bytes,
            "elapsed_s": round(time.monotonic() - started, 1),
            "retry_after": sorted({a.headers.get("retry-after") for a in answers if a.status_code == 429})}


def test_an_estimate_flood_is_bounded_and_leaves_nothing(live):
    """Before: 16 data passes (all 200), a prepared copy of every distinct body left behind after the
    file was deleted. After: at most 10 passes a minute, one at a time (429 with Retry-After), 0 bytes left."""
    with live.watch() as watch:
        figures = estimate_flood(live)
    statuses = figures["statuses"]
    assert set(statuses) <= {200, 429} and 1 <= statuses.count(200) <= 10, figures
    assert statuses.count(429) >= 6 and figures["retry_after"] and None not in figures["retry_after"], figures
    assert figures["left_bytes"] == 0, figures
    _contained(live, watch)
