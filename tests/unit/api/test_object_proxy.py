"""/internal/v1/jobs/{job_id}/objects through the trainer's ProxyStore: the current attempt's token
opens its own job's objects, its data and its base model, and nothing else."""

from __future__ import annotations

import io
import logging

import pytest

from tests.helpers.platform import add_tenant, chat_lines
from tests.unit.scheduler.test_loop import setup  # noqa: F401 - the fixture
from tuneforge.storage import layout
from tuneforge.storage.proxy import ObjectAccessError, ProxyStore, is_proxy_url


def _started(setup):  # noqa: F811
    platform, http, scheduler, executor, create_job, _job, _auth = setup
    job_id = create_job()
    scheduler.tick()
    spec = executor.launched[-1]
    assert spec.job_id == job_id
    return spec


def _store(http, spec, token=None):
    return ProxyStore(spec.storage_url, spec.job_token if token is None else token, client=http)


def _other_tenants_file(platform, http):
    key = add_tenant(platform, "beta")
    answer = http.post("/v1/files", files={"file": ("secret.jsonl", io.BytesIO(chat_lines(3, "beta")))},
                       data={"purpose": "fine-tune"}, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    [found] = [k for k in platform.store.list("tenants") if k.endswith(f"{answer.json()['id']}/secret.jsonl")]
    return found


def test_the_attempt_reads_its_data_and_base_and_writes_its_own_folder(setup):  # noqa: F811
    platform, http, *_ = setup
    spec = _started(setup)
    assert is_proxy_url(spec.storage_url) and spec.job_id in spec.storage_url
    store = _store(http, spec)
    assert store.get_bytes(spec.training_file.key) == platform.store.get_bytes(spec.training_file.key)
    base_keys = store.list(spec.base_model.prefix)
    assert base_keys == platform.store.list(spec.base_model.prefix) and base_keys
    config = f"{spec.base_model.prefix}/config.json"
    assert store.exists(config) and store.size_bytes(config) == platform.store.size_bytes(config)

    folder = layout.checkpoint_prefix(spec.tenant_id, spec.job_id, 3)
    payload = bytes(range(256)) * 40_000  # 10 MB: several chunks each way
    assert store.put_stream(f"{folder}/weights.bin", io.BytesIO(payload)) == len(payload)
    assert platform.store.get_bytes(f"{folder}/weights.bin") == payload
    with store.open_read(f"{folder}/weights.bin") as handle:
        assert handle.read(5) == payload[:5] and handle.read() == payload[5:]
    assert store.get_range(f"{folder}/weights.bin", 1000, 1099) == payload[1000:1100]
    tail = http.get(f"{spec.storage_url[len('tuneforge+'):].split('testserver')[-1]}/{folder}/weights.bin",
                    headers={"Authorization": f"Bearer {spec.job_token}", "Range": "bytes=-3"})
    assert tail.status_code == 206 and tail.content == payload[-3:]
    assert tail.headers["content-range"] == f"bytes {len(payload) - 3}-{len(payload) - 1}/{len(payload)}"
    store.put_bytes(f"{folder}/small.json", b"{}")
    assert store.list(layout.checkpoints_prefix(spec.tenant_id, spec.job_id)) == [f"{folder}/small.json",
                                                                                   f"{folder}/weights.bin"]
    store.delete_prefix(folder)
    assert not store.exists(f"{folder}/small.json") and not platform.store.exists(f"{folder}/weights.bin")
    with pytest.raises(FileNotFoundError):
        store.get_bytes(f"{folder}/small.json")


def test_other_tenants_objects_and_everything_outside_the_scope_are_refused(setup, caplog):  # noqa: F811
    platform, http, *_ = setup
    spec = _started(setup)
    theirs = _other_tenants_file(platform, http)
    store = _store(http, spec)
    with caplog.at_level(logging.WARNING, logger="tuneforge.services.training.objects"):
        for attempt in (lambda: store.get_bytes(theirs), lambda: store.exists(theirs),
                        lambda: store.put_bytes(theirs, b"overwritten"), lambda: store.delete(theirs),
                        lambda: store.list("tenants"), lambda: store.list(theirs.rsplit("/", 2)[0]),
                        lambda: store.get_bytes(spec.training_file.key.rsplit("/", 1)[0] + "/manifest.json"),
                        lambda: store.put_bytes(f"{spec.base_model.prefix}/config.json", b"{}")):
            with pytest.raises(ObjectAccessError) as refused:
                attempt()
            assert refused.value.status_code == 403
            assert refused.value.code in ("object_out_of_scope", None)  # None: HEAD's answer has no body
    assert platform.store.get_bytes(theirs).startswith(b'{"messages"')  # untouched
    assert any(theirs in record.getMessage() and spec.job_id in record.getMessage() for record in caplog.records)
    base = spec.storage_url[len("tuneforge+"):].split("testserver")[-1]
    dotted = http.get(f"{base}/tenants/{spec.tenant_id}/jobs/{spec.job_id}/x/%2E%2E/%2E%2E/%2E%2E/y",
                      headers={"Authorization": f"Bearer {spec.job_token}"})
    assert dotted.status_code in (400, 403, 404)


def test_a_wrong_or_earlier_token_opens_nothing(setup):  # noqa: F811
    platform, http, _scheduler, _executor, create_job, _job, auth = setup
    spec = _started(setup)
    http.app.state.object_grants.ttl_s = 0.0
    for token in ("", "not-a-token", spec.job_token + "x"):
        with pytest.raises(ObjectAccessError) as refused:
            _store(http, spec, token).get_bytes(spec.training_file.key)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_job_token"
    own = layout.results_key(spec.tenant_id, spec.job_id)
    with pytest.raises(ObjectAccessError) as refused:  # refused at the edge, before the body is read
        _store(http, spec, "not-a-token").put_bytes(own, b"x" * 100)
    assert refused.value.status_code == 401 and not platform.store.exists(own)
    # the attempt is no longer current once its job is cancelled
    assert http.post(f"/v1/fine_tuning/jobs/{spec.job_id}/cancel", headers=auth).status_code == 200
    with pytest.raises(ObjectAccessError) as fenced:
        _store(http, spec).get_bytes(spec.training_file.key)
    assert fenced.value.status_code == 409 and fenced.value.code == "stale_attempt"


def test_an_upload_past_the_bound_is_refused_and_leaves_nothing(setup):  # noqa: F811
    platform, http, *_ = setup
    spec = _started(setup)
    platform.settings.trainer_object_max_bytes = 1000
    store = _store(http, spec)
    key = layout.results_key(spec.tenant_id, spec.job_id)
    with pytest.raises(OSError, match="413"):
        store.put_stream(key, io.BytesIO(b"x" * 5000))  # streamed: no length announced
    assert not platform.store.exists(key)
    with pytest.raises(OSError, match="413"):
        store.put_bytes(key, b"x" * 5000)  # announced: refused before a byte is read
    store.put_bytes(key, b"x" * 1000)
    assert platform.store.get_bytes(key) == b"x" * 1000


def test_the_scope_the_plane_grants_is_the_one_the_spec_names(setup):  # noqa: F811
    platform, *_ = setup
    spec = _started(setup)
    from tuneforge.db.repos import jobs as job_repo
    from tuneforge.services.training.objects import scope_of
    from tuneforge.storage.access import spec_scope

    with platform.db.session() as session:
        assert scope_of(session, job_repo.get(session, spec.tenant_id, spec.job_id)) == spec_scope(spec)
