"""The model registry through the API: lineage, stages with gates, filters, delete with a
grace period, admin override with an audit trail, immutable artifacts, duplicate configs."""

from __future__ import annotations

import io

import openai
import pytest

from tests.helpers.platform import chat_lines
from tuneforge.db.tables import FileRow, FineTunedModel, Job
from tuneforge.domain.errors import ApiError
from tuneforge.domain.resolved import ResolvedJob
from tuneforge.domain.spec import Hyperparameters
from tuneforge.registry import lineage
from tuneforge.registry import models as registry
from tuneforge.storage import layout

ADMIN_KEY = "admin-secret"

PASSED = {"passed": True, "gates": [{"metric": "golden.loss", "passed": True, "reason": "ok"}], "suggestions": []}
FAILED = {"passed": False, "suggestions": ["learning_rate 0.0002 -> 0.0001"], "gates": [
    {"metric": "safety.refusal_rate", "passed": False,
     "reason": "safety.refusal_rate fell by 0.45 against the base model (0.95 -> 0.50); at most 0.10 allowed"}]}


@pytest.fixture
def admin_world(world):
    world.platform.settings.admin_api_key = ADMIN_KEY
    return world


def _job(world, key: str, *, seed: int = 3, lines: bytes | None = None) -> str:
    sdk = world.sdk(key)
    training = sdk.files.create(file=("t.jsonl", io.BytesIO(lines or chat_lines(20))), purpose="fine-tune").id
    return sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training, seed=seed).id


def _register(world, job_id: str, gate_report: dict | None, *, files: dict[str, bytes] | None = None,
              eval_results: dict | None = None, evaluation: dict | None = None) -> str:
    """What the control plane does when a trainer reports its result: artifacts in the store,
    the job finished, the model registered."""
    platform = world.platform
    with platform.db.session() as session:
        job = session.query(Job).filter_by(job_id=job_id).one()
        prefix = layout.artifact_prefix(job.tenant_id, job.job_id, "adapter")
        for name, data in (files or {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"w" * 32}
                           ).items():
            platform.store.put_bytes(f"{prefix}/{name}", data)
        job.resolved = ResolvedJob.from_json(
            {"hyperparameters": {"learning_rate": 2e-4, "n_epochs": 3}, "lora": {"rank": 8}, "eval": evaluation})
        training = session.query(FileRow).filter_by(file_id=job.training_file).one()
        job.config_hash = lineage.config_hash(job, training, None)
        job.status, job.fine_tuned_model, job.trained_tokens = "succeeded", f"ft:tiny-base:x::{job_id[-6:]}", 1234
        row = registry.register(session, platform.store, job, model_id=job.fine_tuned_model, artifact_prefix=prefix,
                                artifact_kind="adapter", attempts=2, gate_report=gate_report,
                                eval_results={"base": {}, "fine_tuned": {}} if eval_results is None else eval_results)
        return row.model_id


def test_a_registered_model_shows_its_lineage_and_starts_in_dev(world):
    job_id = _job(world, world.key_a)
    model_id = _register(world, job_id, PASSED)
    body = world.http.get(f"/v1/models/{model_id}", headers=world.headers(world.key_a)).json()
    assert body["stage"] == "dev" and body["promotable"] is True and body["type"] == "fine-tuned"
    lin = body["lineage"]
    with world.platform.db.session() as session:
        job = session.query(Job).filter_by(job_id=job_id).one()
        base_sha = job.base_model_sha256
        training_sha = session.query(FileRow).filter_by(file_id=job.training_file).one().sha256
    assert lin["base_model"] == {"name": "tiny-base", "sha256": base_sha}
    assert lin["training_file"]["sha256"] == training_sha and len(training_sha) == 64
    assert lin["job_id"] == job_id and lin["attempts"] == 2 and lin["trained_tokens"] == 1234
    # the row's partial hyperparameters are resolved values: the ones it lacks take their defaults
    assert lin["hyperparameters"] == Hyperparameters(learning_rate=2e-4, n_epochs=3).flat()
    assert len(lin["hyperparameters_sha256"]) == 64 and lin["config_hash"] == body["config_hash"]
    assert lin["code_version"].startswith("0.1.0")
    assert set(lin["artifact"]["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert "prefix" not in lin["artifact"]  # storage keys are not shown to tenants


def test_promotion_follows_the_stages_and_filters_find_the_model(world):
    model_id = _register(world, _job(world, world.key_a), PASSED)
    h = world.headers(world.key_a)
    assert world.http.post(f"/v1/models/{model_id}/promote", json={"stage": "production"},
                           headers=h).json()["error"]["code"] == "invalid_stage_transition"
    for stage in ("staging", "production"):
        response = world.http.post(f"/v1/models/{model_id}/promote", json={"stage": stage}, headers=h)
        assert response.status_code == 200 and response.json()["stage"] == stage
    found = world.http.get("/v1/models", params={"type": "fine-tuned", "stage": "production",
                                                 "base_model": "tiny-base"}, headers=h).json()["data"]
    assert [m["id"] for m in found] == [model_id]
    assert world.http.get("/v1/models", params={"stage": "staging"}, headers=h).json()["data"] == []
    assert world.http.get("/v1/models", params={"stage": "nope"}, headers=h).json()["error"]["param"] == "stage"
    history = world.http.get(f"/v1/models/{model_id}/stages", headers=h).json()["data"]
    assert [(c["from_stage"], c["to_stage"], c["override"]) for c in history] == [
        ("dev", "staging", False), ("staging", "production", False)]
    assert history[0]["actor"].startswith("tenant:")


def test_a_model_that_failed_its_gates_needs_an_audited_admin_override(admin_world):
    world = admin_world
    model_id = _register(world, _job(world, world.key_a), FAILED)
    h = world.headers(world.key_a)
    body = world.http.get(f"/v1/models/{model_id}", headers=h).json()
    assert body["promotable"] is False and "refusal_rate fell by 0.45" in body["gate_failures"][0]
    refused = world.http.post(f"/v1/models/{model_id}/promote", json={"stage": "staging"}, headers=h)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "gates_failed"
    assert "refusal_rate" in refused.json()["error"]["message"]
    # a tenant cannot override
    assert world.http.post(f"/v1/models/{model_id}/promote", json={"stage": "staging", "override": True},
                           headers=h).status_code == 400
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    no_reason = world.http.post(f"/v1/admin/models/{model_id}/promote",
                                json={"stage": "staging", "override": True}, headers=admin)
    assert no_reason.status_code == 400 and no_reason.json()["error"]["param"] == "reason"
    done = world.http.post(f"/v1/admin/models/{model_id}/promote",
                           json={"stage": "staging", "override": True, "reason": "accepted risk, ticket 12"},
                           headers=admin)
    assert done.status_code == 200 and done.json()["stage"] == "staging"
    history = world.http.get(f"/v1/models/{model_id}/stages", headers=h).json()["data"]
    assert history == [{**history[0], "from_stage": "dev", "to_stage": "staging", "actor": "admin",
                        "override": True, "reason": "accepted risk, ticket 12"}]


def test_a_model_whose_job_was_not_evaluated_stays_in_dev_even_for_an_admin(admin_world):
    """Its job's eval was off: no eval results, no gate report — nothing for an override to pass."""
    world = admin_world
    model_id = _register(world, _job(world, world.key_a), None, eval_results={})
    with world.platform.db.session() as session:  # what the trainer's report leaves when eval is off
        session.query(FineTunedModel).filter_by(model_id=model_id).update({"eval_results": None})
    sdk = world.sdk(world.key_a)
    shown = sdk.models.retrieve(model_id).model_extra
    assert shown["promotable"] is False and shown["evaluated"] is False
    for stage in ("staging", "production"):
        with pytest.raises(openai.ConflictError) as info:
            sdk.post(f"/models/{model_id}/promote", body={"stage": stage}, cast_to=object)
        assert info.value.body["code"] in ("model_not_evaluated", "invalid_stage_transition")
    assert info.value.body["code"] == "invalid_stage_transition"  # dev -> production is not a move at all
    with pytest.raises(openai.ConflictError) as info:
        sdk.post(f"/models/{model_id}/promote", body={"stage": "staging"}, cast_to=object)
    assert info.value.body["code"] == "model_not_evaluated" and "not evaluated" in info.value.body["message"]
    override = world.http.post(f"/v1/admin/models/{model_id}/promote", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                               json={"stage": "staging", "override": True, "reason": "ship it"})
    assert override.status_code == 409 and override.json()["error"]["code"] == "model_not_evaluated"
    # nor may a route send it traffic from dev
    route = world.http.post("/v1/routes", headers=world.headers(world.key_a),
                            json={"name": "r", "versions": [{"model": model_id, "weight": 100}]})
    assert route.status_code == 409 and route.json()["error"]["code"] == "model_not_evaluated"
    with world.platform.db.session() as session:
        assert session.query(FineTunedModel).filter_by(model_id=model_id).one().stage == "dev"


def test_another_tenants_model_is_not_found(world):
    model_id = _register(world, _job(world, world.key_a), PASSED)
    hb = world.headers(world.key_b)
    for response in (world.http.get(f"/v1/models/{model_id}", headers=hb),
                     world.http.post(f"/v1/models/{model_id}/promote", json={"stage": "staging"}, headers=hb),
                     world.http.delete(f"/v1/models/{model_id}", headers=hb)):
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert all(m["id"] != model_id for m in world.http.get("/v1/models", headers=hb).json()["data"])


def test_delete_deprecates_then_purges_after_the_grace_period(world):
    model_id = _register(world, _job(world, world.key_a), PASSED)
    h = world.headers(world.key_a)
    deleted = world.sdk(world.key_a).models.delete(model_id)
    assert deleted.deleted is True
    assert all(m["id"] != model_id for m in world.http.get("/v1/models", headers=h).json()["data"])
    hidden = world.http.get("/v1/models", params={"include_deprecated": "true"}, headers=h).json()["data"]
    assert [m["deprecated"] for m in hidden if m["id"] == model_id] == [True]
    assert world.http.post(f"/v1/models/{model_id}/promote", json={"stage": "staging"},
                           headers=h).json()["error"]["code"] == "model_deprecated"
    assert world.http.post(f"/v1/models/{model_id}/restore", headers=h).json()["deprecated"] is False
    world.sdk(world.key_a).models.delete(model_id)
    store = world.platform.store
    with world.platform.db.session() as session:
        row = session.query(FineTunedModel).filter_by(model_id=model_id).one()
        prefix, delete_after = row.artifact_prefix, row.delete_after
        assert delete_after - row.deprecated_at == int(world.platform.settings.model_delete_grace_s)
        assert registry.purge_expired(session, store, now=delete_after - 1) == []
        assert store.list(prefix)
        # a job still continuing from the model's files (read in place) keeps them until it ends
        reader = session.query(Job).filter(Job.job_id != row.job_id, Job.tenant_id == row.tenant_id).first() or \
            session.query(Job).filter_by(job_id=row.job_id).one()
        before = (reader.parent, reader.status)
        reader.parent, reader.status = {"model": model_id, "model_prefix": prefix}, "running"
        session.flush()
        assert registry.purge_expired(session, store, now=delete_after) == [] and store.list(prefix)
        reader.parent, reader.status = before
        session.flush()
        assert registry.purge_expired(session, store, now=delete_after) == [model_id]
    assert store.list(prefix) == []
    assert world.http.get(f"/v1/models/{model_id}", headers=h).status_code == 404


def test_a_changed_artifact_is_detected(world):
    model_id = _register(world, _job(world, world.key_a), PASSED)
    with world.platform.db.session() as session:
        row = session.query(FineTunedModel).filter_by(model_id=model_id).one()
        registry.verify_artifacts(world.platform.store, row)  # untouched: fine
        world.platform.store.put_bytes(f"{row.artifact_prefix}/adapter_model.safetensors", b"tampered")
        with pytest.raises(ApiError) as caught:
            registry.verify_artifacts(world.platform.store, row)
    assert caught.value.code == "artifact_modified" and "adapter_model.safetensors" in caught.value.message


def test_a_second_job_with_the_same_configuration_is_pointed_out(world):
    lines = chat_lines(20, prefix="same")
    first = _register(world, _job(world, world.key_a, seed=5, lines=lines), PASSED)
    second_job = _job(world, world.key_a, seed=5, lines=lines)
    second = _register(world, second_job, PASSED)
    with world.platform.db.session() as session:
        rows = {r.model_id: r for r in session.query(FineTunedModel).all()}
    assert rows[first].config_hash == rows[second].config_hash
    events = world.sdk(world.key_a).fine_tuning.jobs.list_events(second_job, limit=50).data
    pointed = [e for e in events if (e.data or {}).get("code") == "duplicate_config"]
    assert len(pointed) == 1 and pointed[0].data["same_as"] == first
    other_seed = _register(world, _job(world, world.key_a, seed=6, lines=lines), PASSED)
    with world.platform.db.session() as session:
        assert session.query(FineTunedModel).filter_by(model_id=other_seed).one().config_hash != rows[first].config_hash


GOLDEN_EVAL = {"enabled": True, "golden": True, "safety": False}
LOSS_GATE = {"metric": "golden.loss", "op": "<=", "threshold": 0.5, "relative_to_base": True}


def _evaluated(world, golden_loss: float, *, evaluation: dict | None = None) -> str:
    """A model whose golden loss is `golden_loss` against a base at 2.0, its gate passed."""
    gate = {**LOSS_GATE, "value": golden_loss - 2.0, "passed": True, "reason": "ok"}
    return _register(world, _job(world, world.key_a), {"passed": True, "gates": [gate], "suggestions": []},
                     eval_results={"base": {"golden.loss": 2.0}, "fine_tuned": {"golden.loss": golden_loss}},
                     evaluation=evaluation or GOLDEN_EVAL)


def test_a_challenger_worse_than_the_production_model_is_blocked(admin_world):
    world = admin_world
    sdk = world.sdk(world.key_a)

    def promote(model_id: str, stage: str):
        return sdk.post(f"/models/{model_id}/promote", body={"stage": stage}, cast_to=object)

    champion = _evaluated(world, 1.0)
    alone = sdk.models.retrieve(champion).model_extra["champion"]
    assert alone["model"] is None and alone["passed"] is True  # nothing in production yet
    for stage in ("staging", "production"):
        promote(champion, stage)
    # within its gate against the base (2.4 - 2.0 <= 0.5), but 1.4 above the champion's 1.0
    challenger = _evaluated(world, 2.4)
    shown = sdk.models.retrieve(challenger).model_extra
    assert shown["promotable"] is True and shown["gates"][0]["passed"] is True
    verdict = shown["champion"]
    assert verdict["model"] == champion and verdict["passed"] is False
    assert verdict["comparisons"] == [{
        "metric": "golden.loss", "op": "<=", "allowed": 0.5, "challenger": 2.4, "champion": 1.0,
        "difference": pytest.approx(1.4), "compared": True, "passed": False,
        "reason": "golden.loss is 2.40 against the production model's 1.00; at most 0.50 higher is allowed"}]
    with pytest.raises(openai.ConflictError) as info:
        promote(challenger, "staging")
    assert info.value.body["code"] == "champion_regression" and champion in info.value.body["message"]
    # within the allowed regression: promoted
    close = _evaluated(world, 1.3)
    assert sdk.models.retrieve(close).model_extra["champion"]["passed"] is True
    assert promote(close, "staging")["stage"] == "staging"
    # an operator may override, with a reason, and it is audited
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    done = world.http.post(f"/v1/admin/models/{challenger}/promote", headers=admin,
                           json={"stage": "staging", "override": True, "reason": "new data, accepted"})
    assert done.status_code == 200 and done.json()["champion"]["passed"] is False
    history = world.http.get(f"/v1/models/{challenger}/stages", headers=world.headers(world.key_a)).json()["data"]
    assert history[-1]["override"] is True and history[-1]["reason"] == "new data, accepted"


def test_figures_from_another_eval_are_not_compared(world):
    """The champion's golden figures came from another shipped set or none at all: nothing to hold against."""
    sdk = world.sdk(world.key_a)
    champion = _evaluated(world, 1.0, evaluation={"enabled": True, "golden": False, "safety": False})
    for stage in ("staging", "production"):
        sdk.post(f"/models/{champion}/promote", body={"stage": stage}, cast_to=object)
    challenger = _evaluated(world, 2.4)
    verdict = sdk.models.retrieve(challenger).model_extra["champion"]
    assert verdict["model"] == champion and verdict["passed"] is True
    assert verdict["comparisons"][0]["compared"] is False and "not compared" in verdict["comparisons"][0]["reason"]
    assert sdk.post(f"/models/{challenger}/promote", body={"stage": "staging"}, cast_to=object)["stage"] == "staging"
