"""Every transition that adds a waiting job is admitted like a create (services/training/jobs.py): resume
of a paused job under the queue cap and the month's GPU-hours; estimates cached by content and
bounded per tenant, leaving nothing in the store."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.helpers.platform import add_base_model, add_tenant, chat_lines, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.services.training import estimates
from tuneforge.storage import layout


@pytest.fixture
def world(tmp_path, database_url, tiny_model_dir):
    platform = make_platform(tmp_path, database_url, estimates_per_minute=3)
    add_base_model(platform, "tiny-base", tiny_model_dir)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    key = add_tenant(platform, "trial", "free")  # 3 waiting jobs at most
    yield platform, http, {"Authorization": f"Bearer {key}"}
    http.close()
    platform.db.dispose()


def _training(http: TestClient, headers: dict, count: int = 20) -> str:
    return http.post("/v1/files", headers=headers, data={"purpose": "fine-tune"},
                     files={"file": ("train.jsonl", io.BytesIO(chat_lines(count)))}).json()["id"]


def _waiting(platform) -> int:
    with platform.db.session() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.status.in_(("queued",
                                                                                          "validating_files"))))


def test_pause_create_resume_cannot_pass_the_queue_cap(world):
    platform, http, headers = world
    body = {"model": "tiny-base", "training_file": _training(http, headers)}
    jobs = [http.post("/v1/fine_tuning/jobs", headers=headers, json=body).json()["id"] for _ in range(3)]
    for job_id in jobs:
        assert http.post(f"/v1/fine_tuning/jobs/{job_id}/pause", headers=headers).status_code == 200
    more = [http.post("/v1/fine_tuning/jobs", headers=headers, json=body).json()["id"] for _ in range(3)]
    assert _waiting(platform) == 3 and all(more)
    refused = http.post(f"/v1/fine_tuning/jobs/{jobs[0]}/resume", headers=headers)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded" and "3 queued or validating" in \
        refused.json()["error"]["message"]
    assert http.get(f"/v1/fine_tuning/jobs/{jobs[0]}", headers=headers).json()["status"] == "paused"
    assert _waiting(platform) == 3
    http.post(f"/v1/fine_tuning/jobs/{more[0]}/cancel", headers=headers)
    assert http.post(f"/v1/fine_tuning/jobs/{jobs[0]}/resume", headers=headers).status_code == 200
    assert http.post(f"/v1/fine_tuning/jobs/{jobs[1]}/resume", headers=headers).status_code == 429
    assert _waiting(platform) == 3


def test_resume_is_refused_once_the_month_s_gpu_hours_are_used_up(world):
    platform, http, headers = world
    body = {"model": "tiny-base", "training_file": _training(http, headers)}
    job_id = http.post("/v1/fine_tuning/jobs", headers=headers, json=body).json()["id"]
    http.post(f"/v1/fine_tuning/jobs/{job_id}/pause", headers=headers)
    with platform.db.session() as session:
        tenant_service.set_quota(session, "trial", {"gpu_hours_hard": 0})
    refused = http.post(f"/v1/fine_tuning/jobs/{job_id}/resume", headers=headers)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "quota_exceeded"


def _estimate(http: TestClient, headers: dict, body: dict):
    return http.post("/v1/fine_tuning/jobs/estimate", headers=headers, json=body)


def test_an_estimate_is_cached_by_content_and_leaves_no_prepared_data(world, monkeypatch):
    platform, http, headers = world
    passes = []
    real = estimates.admitted

    def counted(*args, **kwargs):
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimates, "admitted", counted)
    training = _training(http, headers)
    twin = _training(http, headers)  # the same bytes under another id
    one_epoch = {"n_epochs": 1}
    first = _estimate(http, headers, {"model": "tiny-base", "training_file": training, "hyperparameters": one_epoch})
    assert first.status_code == 200, first.text
    again = _estimate(http, headers, {"model": "tiny-base", "training_file": twin, "hyperparameters": one_epoch})
    assert again.json() == first.json() and len(passes) == 1
    other = _estimate(http, headers, {"model": "tiny-base", "training_file": training, "seed": 7,
                                      "hyperparameters": {"n_epochs": 2}})
    assert other.status_code == 200 and other.json()["steps"] == 2 * first.json()["steps"] and len(passes) == 2
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "trial").tenant_id
    assert platform.store.list(f"{layout.tenant_prefix(tenant_id)}/datasets") == []


def test_estimate_passes_are_limited_per_tenant_with_retry_after(world):
    _platform, http, headers = world
    training = _training(http, headers)
    answers = [_estimate(http, headers, {"model": "tiny-base", "training_file": training, "seed": seed})
               for seed in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "estimate_rate_exceeded"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    cached = _estimate(http, headers, {"model": "tiny-base", "training_file": training, "seed": 0})
    assert cached.status_code == 200  # an estimate already made is free


def test_a_bad_body_s_answer_is_cached_too(world, monkeypatch):
    """A body the data pass refuses is as costly to refuse again: its 400 is cached like figures."""
    from tuneforge.domain.errors import invalid
    from tuneforge.services.training import jobs as job_service

    _platform, http, headers = world
    calls = []

    def refusing(*_args, **_kwargs):
        calls.append(1)
        raise invalid("line 3: too long for max_seq_length", param="training_file", code="example_too_long")

    monkeypatch.setattr(job_service, "plan_job", refusing)
    body = {"model": "tiny-base", "training_file": _training(http, headers), "seed": 99}
    answers = [_estimate(http, headers, body) for _ in range(5)]
    assert [a.status_code for a in answers] == [400] * 5 and len(calls) == 1
    assert answers[-1].json()["error"] == answers[0].json()["error"]
    assert answers[0].json()["error"]["code"] == "example_too_long"


def test_one_estimate_at_a_time_per_tenant(tmp_path):
    with estimates.admitted(tmp_path, "tenant-a", per_minute=10):
        with pytest.raises(Exception) as caught:
            with estimates.admitted(tmp_path, "tenant-a", per_minute=10):
                pass
        assert caught.value.status_code == 429 and caught.value.code == "estimate_in_progress"
        assert caught.value.retry_after == estimates.IN_FLIGHT_RETRY_AFTER_S
        with estimates.admitted(tmp_path, "tenant-b", per_minute=10):  # another tenant is not held up
            pass
    with estimates.admitted(tmp_path, "tenant-a", per_minute=10):  # the first one ended: room again
        pass


def test_the_rate_window_slides(tmp_path):
    for offset in (0.0, 10.0):
        with estimates.admitted(tmp_path, "t", per_minute=2, now=1000.0 + offset):
            pass
    with pytest.raises(Exception) as caught:
        with estimates.admitted(tmp_path, "t", per_minute=2, now=1030.0):
            pass
    assert caught.value.retry_after == 30  # the first pass leaves the window at 1060
    with estimates.admitted(tmp_path, "t", per_minute=2, now=1061.0):
        pass


def test_the_cache_is_bounded_and_entries_expire():
    cache = estimates.EstimateCache(max_entries=2)
    for key in ("a", "b", "c"):
        cache.put(key, {"key": key}, now=0.0)
    assert len(cache) == 2 and cache.get("a", now=1.0) is None and cache.get("c", now=1.0) == {"key": "c"}
    assert cache.get("c", now=estimates.ESTIMATE_CACHE_TTL_S + 1.0) is None
    estimates.EstimateCache(max_entries=0).put("a", {}, now=0.0)  # caches nothing, fails nothing


def test_the_content_key_is_the_bytes_not_the_ids():
    common = dict(training_sha256="s" * 64, validation_sha256=None, base_sha256="b" * 64, pii_policy="warn")
    one = estimates.content_key("t1", {"training_file": "file-1", "seed": 1}, **common)
    assert one == estimates.content_key("t1", {"training_file": "file-2", "seed": 1}, **common)
    assert one != estimates.content_key("t2", {"training_file": "file-1", "seed": 1}, **common)
    assert one != estimates.content_key("t1", {"training_file": "file-1", "seed": 2}, **common)
    assert one != estimates.content_key("t1", {"training_file": "file-1", "seed": 1},
                                        **{**common, "training_sha256": "z" * 64})


def test_a_generating_methods_estimate_counts_its_samples_and_sampling():
    from types import SimpleNamespace

    from tuneforge.settings import Settings

    settings = Settings(gpu_effective_tflops=100.0, price_per_gpu_hour={"default": 2.0})
    base = SimpleNamespace(num_parameters=1_000_000_000, size_bytes=2_000_000_000)
    common = dict(train_tokens_per_epoch=50_000, train_examples=1_000, n_epochs=2, batch_size=8,
                  training_type="lora")
    plain = estimates.estimate(settings, base, **common)
    rft = estimates.estimate(settings, base, **common, rollout_group=8, completion_tokens=100)
    # (50,000 prompt tokens + 1,000 prompts x 100 completion tokens) x 8 samples x 2 epochs
    assert plain.training_tokens == 100_000 and rft.training_tokens == 150_000 * 8 * 2
    # LoRA: 4 FLOPs per parameter and token trained, + 2 for sampling it first
    assert rft.estimated_runtime_seconds == pytest.approx(6.0 * 1e9 * 2_400_000 / 100e12, rel=1e-3)
    assert rft.steps == plain.steps == 250
