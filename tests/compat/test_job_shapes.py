"""Fine-tuning jobs and models (docs/openai-compat.md): statuses within the SDK's values, OpenAI's
event wording, the request checks OpenAI makes, delete semantics, Together's names."""

from __future__ import annotations

import io

import httpx
import openai
import pytest
from openai.types.fine_tuning import FineTuningJob

from tests.compat.conftest import start_live
from tests.helpers.platform import add_running_job, chat_lines
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.metrics import metrics_message

SDK_STATUSES = set(FineTuningJob.model_fields["status"].annotation.__args__) | {"pausing", "paused"}


def _set(live, tenant_id: str, job_id: str, **values) -> None:
    with live.plane.platform.db.session() as session:
        job = job_repo.get(session, tenant_id, job_id)
        for key, value in values.items():
            setattr(job, key, value)


def _running(live):
    key, tenant_id, job_id = add_running_job(live.plane.platform, "tenant-with-a-job")
    return live.sdk(key), key, tenant_id, job_id


def test_an_evaluating_job_shows_running_and_its_precise_status_beside(live):
    sdk, key, tenant_id, job_id = _running(live)
    _set(live, tenant_id, job_id, status="evaluating")
    job = sdk.fine_tuning.jobs.retrieve(job_id)
    assert job.status == "running" and job.model_extra["precise_status"] == "evaluating"
    listed = sdk.fine_tuning.jobs.list().data
    assert [(j.id, j.status) for j in listed] == [(job_id, "running")]
    for shown in listed + [job]:
        assert shown.status in SDK_STATUSES


def test_a_running_job_asked_to_pause_shows_pausing_then_paused(live):
    sdk, key, tenant_id, job_id = _running(live)
    paused = sdk.fine_tuning.jobs.pause(job_id)
    assert paused.status == "pausing" and paused.model_extra["precise_status"] == "running"
    assert sdk.fine_tuning.jobs.retrieve(job_id).status == "pausing"
    _set(live, tenant_id, job_id, status="paused", pause_requested=False)
    assert sdk.fine_tuning.jobs.retrieve(job_id).status == "paused"


def test_pausing_an_evaluating_job_is_refused_not_ignored(live):
    sdk, key, tenant_id, job_id = _running(live)
    _set(live, tenant_id, job_id, status="evaluating")
    with pytest.raises(openai.BadRequestError) as err:
        sdk.fine_tuning.jobs.pause(job_id)
    assert err.value.code == "job_not_pausable" and "evaluating" in err.value.message
    with live.plane.platform.db.session() as session:
        assert job_repo.get(session, tenant_id, job_id).pause_requested is False


def test_strict_statuses_off_shows_the_precise_one(tmp_path, database_url, tiny_model_dir):
    live = start_live(tmp_path, database_url, tiny_model_dir, openai_strict_status=False)
    try:
        sdk, key, tenant_id, job_id = _running(live)
        _set(live, tenant_id, job_id, status="evaluating")
        assert sdk.fine_tuning.jobs.retrieve(job_id).status == "evaluating"
    finally:
        live.plane.close()


def _training_file(sdk) -> str:
    return sdk.files.create(file=("train.jsonl", io.BytesIO(chat_lines(20))), purpose="fine-tune").id


def test_hyperparameters_given_twice_are_refused(live):
    sdk = live.sdk()
    training = _training_file(sdk)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, hyperparameters={"n_epochs": 2},
                                    method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}}})
    assert err.value.code == "conflicting_parameters" and err.value.param == "hyperparameters"
    with pytest.raises(openai.BadRequestError) as err:  # a DPO job cannot take the supervised top-level set
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, hyperparameters={"n_epochs": 2},
                                    method={"type": "dpo"})
    assert err.value.code == "conflicting_parameters"
    assert sdk.fine_tuning.jobs.list().data == []
    job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, hyperparameters={"n_epochs": 2},
                                      method={"type": "supervised"})
    assert job.hyperparameters.n_epochs == 2


@pytest.mark.parametrize("metadata, param", [
    ({f"k{i}": "v" for i in range(17)}, "metadata"),
    ({"k" * 65: "v"}, "metadata"),
    ({"k": "v" * 513}, "metadata.k"),
])
def test_metadata_limits_are_openais(live, metadata, param):
    sdk = live.sdk()
    with pytest.raises(openai.BadRequestError) as err:
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=_training_file(sdk), metadata=metadata)
    assert err.value.param is not None and err.value.param.startswith(param)


def test_the_first_events_read_as_openais(live):
    sdk = live.sdk()
    training = _training_file(sdk)
    job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training)
    messages = [event.message for event in sdk.fine_tuning.jobs.list_events(job.id).data][::-1]
    assert messages[:2] == [f"Created fine-tuning job: {job.id}", f"Validating training file: {training}"]


def test_metrics_messages_are_worded_as_openais():
    assert metrics_message({"step": 3, "total_steps": 40, "train_loss": 1.23456}) == \
        "Step 3/40: training loss=1.23"
    assert metrics_message({"step": 40, "total_steps": 40, "train_loss": 0.5, "valid_loss": 0.75}) == \
        "Step 40/40: training loss=0.50, validation loss=0.75"
    assert metrics_message({"step": 2, "total_steps": 40, "train_loss": None}) == "Step 2/40"


def test_together_names_for_the_adapter_are_accepted(live):
    sdk = live.sdk()
    training = _training_file(sdk)
    job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, extra_body={
        "lora_r": 4, "lora_alpha": 16, "lora_dropout": 0.05, "lora_trainable_modules": "q_proj, v_proj"})
    shown = job.model_extra["training_type"]
    assert (shown["type"], shown["rank"], shown["alpha"], shown["dropout"]) == ("lora", 4, 16, 0.05)
    assert shown["target_modules"] == ["q_proj", "v_proj"]
    with pytest.raises(openai.BadRequestError) as err:
        sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training,
                                    extra_body={"lora_r": 4, "training_type": {"rank": 8}})
    assert "lora_r" in err.value.message and "training_type.rank" in err.value.message


def test_estimate_price_answers_under_togethers_path(live):
    sdk = live.sdk()
    training = _training_file(sdk)
    body = {"model": "tiny-base", "training_file": training}
    headers = {"Authorization": f"Bearer {live.key_a}"}
    ours = httpx.post(f"{live.url}/v1/fine_tuning/jobs/estimate", json=body, headers=headers)
    together = httpx.post(f"{live.url}/v1/fine-tunes/estimate-price", json=body, headers=headers)
    assert ours.status_code == together.status_code == 200, together.text
    estimate = together.json()
    assert estimate["training_tokens"] > 0
    assert estimate["estimated_total_price"] == ours.json()["estimated_price"]
    assert estimate["estimated_train_token_count"] == ours.json()["training_tokens"]
    assert estimate["allowed_to_proceed"] is True


def test_a_deleted_model_is_gone_for_retrieve_and_a_second_delete(live):
    from tests.helpers.platform import add_finished_job

    key, model_id = add_finished_job(live.plane.platform, "owner-of-a-model")
    sdk = live.sdk(key)
    assert sdk.models.retrieve(model_id).id == model_id
    assert sdk.models.delete(model_id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve(model_id)
    with pytest.raises(openai.NotFoundError):
        sdk.models.delete(model_id)
    assert model_id not in [m.id for m in sdk.models.list().data]
    # the grace period's extension: still there when asked for, and restorable
    response = httpx.get(f"{live.url}/v1/models/{model_id}", params={"include_deprecated": "true"},
                         headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200 and response.json()["deprecated"] is True


def test_checkpoint_permissions_are_not_found_as_documented(live):
    """docs/openai-compat.md: a tenant's checkpoints are never shared with another tenant."""
    sdk = live.sdk()
    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.checkpoints.permissions.retrieve("ft:tiny-base:acme::abc:ckpt-step-3")
    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.checkpoints.permissions.create("ft:tiny-base:acme::abc:ckpt-step-3",
                                                       project_ids=["proj_1"])


def _store_secret(live, name: str, value: str, key: str | None = None) -> None:
    response = httpx.post(f"{live.url}/v1/secrets", json={"name": name, "value": value},
                          headers={"Authorization": f"Bearer {key or live.key_a}"})
    assert response.status_code in (200, 201), response.text


def test_integrations_are_taken_shown_and_refused_by_the_field_at_fault(tmp_path, database_url, tiny_model_dir):
    live = start_live(tmp_path, database_url, tiny_model_dir)
    try:
        sdk = live.sdk()
        training = _training_file(sdk)

        def refused(integrations) -> openai.BadRequestError:
            with pytest.raises(openai.BadRequestError) as err:
                sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, integrations=integrations)
            return err.value

        # OpenAI's wandb integration logs with the tenant's own key: none stored yet
        err = refused([{"type": "wandb", "wandb": {"project": "p"}}])
        assert (err.param, err.code) == ("integrations.0.wandb.api_key_secret", "secret_not_found")
        assert "WANDB_API_KEY" in err.message
        _store_secret(live, "WANDB_API_KEY", "local-0123456789")
        job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, integrations=[
            {"type": "wandb", "wandb": {"project": "p", "entity": "team", "name": "run", "tags": ["a"]}},
            {"type": "tensorboard"},
            {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example.com", "experiment_name": "e"}}])
        assert [item.type for item in job.integrations] == ["wandb", "tensorboard", "mlflow"]
        assert job.integrations[0].wandb.project == "p" and job.integrations[0].wandb.tags == ["a"]
        shown = sdk.fine_tuning.jobs.retrieve(job.id).model_dump(exclude_none=True)["integrations"]
        assert shown[2] == {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example.com",
                                                          "experiment_name": "e"}}
        for integrations, param, code in (
                ([{"type": "wandb", "wandb": {"project": "p", "api_key_secret": "OTHER"}}],
                 "integrations.0.wandb.api_key_secret", "secret_not_found"),
                ([{"type": "wandb", "wandb": {"project": "p", "api_key": "x"}}], "integrations.0.wandb.api_key", None),
                ([{"type": "wandb"}], "integrations.0.wandb", None),
                ([{"type": "wandb", "wandb": {"project": "p", "tags": ["t"] * 51}}], "integrations.0.wandb.tags", None),
                ([{"type": "tensorboard"}, {"type": "tensorboard"}], "integrations.1.type", None),
                ([{"type": "comet"}], "integrations.0.type", None),
                ([{"type": "mlflow"}], "integrations.0.mlflow.tracking_uri", "unsupported_integration"),
                ([{"type": "mlflow", "mlflow": {"tracking_uri": "file:///etc"}}],
                 "integrations.0.mlflow.tracking_uri", "invalid_url"),
                ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://10.1.2.3:5000"}}],
                 "integrations.0.mlflow.tracking_uri", "url_not_allowed"),
                ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://169.254.169.254/"}}],
                 "integrations.0.mlflow.tracking_uri", "url_not_allowed"),
                ([{"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example.com",
                                                "username_secret": "WANDB_API_KEY"}}],
                 "integrations.0.mlflow.username_secret", None),
                ([{"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example.com",
                                                "token_secret": "MISSING"}}],
                 "integrations.0.mlflow.token_secret", "secret_not_found"),
                ([{"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example.com",
                                                "token_secret": "../../etc/passwd"}}],
                 "integrations.0.mlflow.token_secret", None)):
            err = refused(integrations)
            assert err.param == param, (integrations, err.param, err.message)
            if code is not None:
                assert err.code == code, (integrations, err.code)
        # another tenant's secret of the same name is not this tenant's
        other = live.sdk(live.key_b)
        with pytest.raises(openai.BadRequestError) as err:
            other.fine_tuning.jobs.create(model="tiny-base", training_file=_training_file(other),
                                          integrations=[{"type": "wandb", "wandb": {"project": "p"}}])
        assert err.value.code == "secret_not_found"
    finally:
        live.plane.close()


def test_the_operator_decides_where_wandb_and_mlflow_runs_go(tmp_path, database_url, tiny_model_dir):
    live = start_live(tmp_path, database_url, tiny_model_dir, wandb_mode="off",
                      mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        sdk = live.sdk()
        training = _training_file(sdk)
        with pytest.raises(openai.BadRequestError) as err:
            sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training,
                                        integrations=[{"type": "wandb", "wandb": {"project": "p"}}])
        assert (err.value.param, err.value.code) == ("integrations.0.type", "unsupported_integration")
        job = sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, integrations=[{"type": "mlflow"}])
        assert [item.type for item in job.integrations] == ["mlflow"]
        with pytest.raises(openai.BadRequestError) as err:  # the platform's server takes no tenant credentials
            sdk.fine_tuning.jobs.create(model="tiny-base", training_file=training, integrations=[
                {"type": "mlflow", "mlflow": {"token_secret": "T"}}])
        assert err.value.param == "integrations.0.mlflow.tracking_uri"
    finally:
        live.plane.close()
