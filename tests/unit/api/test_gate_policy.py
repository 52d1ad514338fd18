"""The operator's gate policy at job creation, through the SDK: a body may add and tighten
gates, never turn a required eval off or loosen a required gate (400 naming the field,
before anything is stored or run)."""

from __future__ import annotations

import io

import openai
import pytest

from tests.helpers.platform import chat_lines
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job
from tuneforge.domain.job_config import JobRequest
from tuneforge.services.training import evaluation
from tuneforge.settings.gates import PolicyGate, TierGatePolicy

REQUIRED = PolicyGate(metric="golden.loss", op="<=", threshold=0.5, relative_to_base=True)


@pytest.fixture
def policed(world):
    """The world's tenants are of the standard tier: it requires the golden and safety evals and one gate."""
    world.platform.settings.gate_policy = {
        "standard": TierGatePolicy(required_evals=["golden", "safety"], gates=[REQUIRED])}
    return world


def _create(world, eval_body: dict | None):
    sdk = world.sdk(world.key_a)
    training = sdk.files.create(file=("t.jsonl", io.BytesIO(chat_lines(20))), purpose="fine-tune").id
    extra = {"eval": eval_body} if eval_body is not None else {}
    return sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training, seed=1, extra_body=extra)


def _refused(world, eval_body: dict) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        _create(world, eval_body)
    error = info.value.body
    assert error["code"] == "below_gate_policy", error
    with world.platform.db.session() as session:
        assert session.query(Job).count() == 0  # nothing stored, nothing queued
    return error


def test_a_body_cannot_loosen_a_required_gate(policed):
    error = _refused(policed, {"gates": [
        {"metric": "safety.refusal_rate", "op": ">=", "threshold": 0.9},
        {"metric": "golden.loss", "op": "<=", "threshold": 2.0, "relative_to_base": True}]})
    assert error["param"] == "eval.gates[1].threshold"
    assert "golden.loss <= 0.5 relative to the base model" in error["message"]
    # the same bound with a weaker comparison ("<=" where "<" is required) names the op
    policed.platform.settings.gate_policy["standard"].gates = [
        PolicyGate(metric="golden.loss", op="<", threshold=0.5, relative_to_base=True)]
    error = _refused(policed, {"gates": [{"metric": "golden.loss", "op": "<=", "threshold": 0.5,
                                          "relative_to_base": True}]})
    assert error["param"] == "eval.gates[0].op"


def test_a_body_cannot_turn_off_a_required_eval(policed):
    assert _refused(policed, {"enabled": False})["param"] == "eval.enabled"
    assert _refused(policed, {"safety": False})["param"] == "eval.safety"
    assert _refused(policed, {"golden": False, "safety": True})["param"] == "eval.golden"


def test_a_gate_implies_its_eval(policed):
    """A tier that only names a golden-set gate requires the golden eval that measures it."""
    policed.platform.settings.gate_policy = {"standard": TierGatePolicy(gates=[REQUIRED])}
    assert _refused(policed, {"golden": False})["param"] == "eval.golden"
    _create(policed, {"safety": False})  # not required: the tenant may skip it


def test_a_stricter_gate_is_taken_and_the_required_ones_are_added(policed):
    stricter = {"metric": "golden.loss", "op": "<=", "threshold": 0.2, "relative_to_base": True}
    extra = {"metric": "validation.loss", "op": "<", "threshold": 3.0, "relative_to_base": False}
    job = _create(policed, {"gates": [stricter, extra]})
    assert job.status == "validating_files"
    settings = policed.platform.settings
    with policed.platform.db.session() as session:
        tenant_id = session.query(Job).filter_by(job_id=job.id).one().tenant_id
        assert tenant_repo.tier_of(session, tenant_id) == "standard"
        resolved = evaluation.resolve(session, settings, tenant_id, JobRequest(
            model="tiny-base", training_file="file-x", eval={"gates": [stricter, extra], "enabled": True}))
        assert [g.metric for g in resolved.gates] == ["golden.loss", "validation.loss"]  # covered: not added
        assert resolved.gates[0].threshold == 0.2 and resolved.golden and resolved.safety
        # a body silent on eval, on a platform that does not evaluate by default, is still evaluated
        settings.eval_by_default = False
        resolved = evaluation.resolve(session, settings, tenant_id, JobRequest(model="tiny-base",
                                                                               training_file="file-x"))
        assert resolved.enabled and resolved.golden and resolved.safety
        assert (REQUIRED.metric, REQUIRED.threshold) in {(g.metric, g.threshold) for g in resolved.gates}
        # an empty list of gates does not drop the required one
        resolved = evaluation.resolve(session, settings, tenant_id, JobRequest(
            model="tiny-base", training_file="file-x", eval={"gates": []}))
        assert [(g.metric, g.op, g.threshold) for g in resolved.gates] == [("golden.loss", "<=", 0.5)]


def test_another_tier_is_not_held_to_it(policed):
    policed.platform.settings.gate_policy = {"premium": TierGatePolicy(gates=[REQUIRED])}
    assert _create(policed, {"enabled": False, "gates": [
        {"metric": "golden.loss", "op": "<=", "threshold": 2.0, "relative_to_base": True}]}).status \
        == "validating_files"


def test_the_policy_setting_is_json_by_tier(monkeypatch):
    from tuneforge.settings import Settings

    monkeypatch.setenv("TUNEFORGE_GATE_POLICY", '{"free": {"required_evals": ["safety"], "gates": '
                                                '[{"metric": "golden.loss", "op": "<=", "threshold": 0.5}]}}')
    policy = Settings().gate_policy_of("free")
    assert policy.requires_eval and policy.evals == {"safety", "golden"}
    assert Settings().gate_policy_of("premium").requires_eval is False
    monkeypatch.setenv("TUNEFORGE_GATE_POLICY", '{"gold": {}}')
    with pytest.raises(ValueError, match="unknown tier"):
        Settings()
