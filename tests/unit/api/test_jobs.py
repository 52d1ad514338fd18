from __future__ import annotations

import io

import openai
import pytest
from sqlalchemy import func, select

from tests.helpers.platform import chat_lines
from tuneforge.db.tables import Job


def _upload(sdk, lines: bytes, name: str = "train.jsonl") -> str:
    return sdk.files.create(file=(name, io.BytesIO(lines)), purpose="fine-tune").id


def _job_count(world) -> int:
    with world.platform.db.session() as session:
        return session.scalar(select(func.count()).select_from(Job))


def test_create_job_with_extensions_and_read_it_back(world):
    sdk = world.sdk(world.key_a)
    training = _upload(sdk, chat_lines(20))
    job = sdk.fine_tuning.jobs.create(
        model=world.base_model, training_file=training, suffix="codes", seed=7,
        metadata={"team": "search"},
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 2, "learning_rate": 1e-3, "warmup_ratio": 0.1, "max_seq_length": 256}}},
        extra_body={"training_type": {"type": "lora", "rank": 4, "alpha": 8}},
    )
    assert job.id.startswith("ftjob-")
    assert job.status == "validating_files"
    assert job.model == "tiny-base" and job.seed == 7 and job.metadata == {"team": "search"}
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size == "auto"
    again = sdk.fine_tuning.jobs.retrieve(job.id)
    assert again.id == job.id and again.training_file == training
    events = sdk.fine_tuning.jobs.list_events(job.id).data  # newest first, in OpenAI's words
    assert [e.message for e in events] == [f"Validating training file: {training}",
                                           f"Created fine-tuning job: {job.id}"]


@pytest.mark.parametrize(
    "change, param",
    [
        ({"model": "no-such-model"}, "model"),
        ({"training_file": "file-doesnotexist"}, "training_file"),
        ({"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "warp": 9}}}},
         "method.supervised.hyperparameters.warp"),
        ({"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}}},
         "method.supervised.hyperparameters.n_epochs"),
        ({"frobnicate": True}, "frobnicate"),
        ({"training_type": {"type": "lora", "rnak": 4}}, "training_type.rnak"),
        ({"training_type": {"type": "qlora"}, "distributed": {"strategy": "fsdp"}}, "distributed.strategy"),
        ({"distributed": {"strategy": "zero3"}}, "distributed.strategy"),
    ],
)
def test_bad_create_answers_400_naming_the_param_and_creates_nothing(world, change, param):
    training = _upload(world.sdk(world.key_a), chat_lines(20))
    body = {"model": world.base_model, "training_file": training, **change}
    response = world.http.post("/v1/fine_tuning/jobs", json=body, headers=world.headers(world.key_a))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert _job_count(world) == 0


def test_invalid_training_file_names_the_line(world):
    sdk = world.sdk(world.key_a)
    bad = _upload(sdk, chat_lines(12) + b'{"messages": "oops"}\n')
    with pytest.raises(openai.BadRequestError) as info:
        sdk.fine_tuning.jobs.create(model=world.base_model, training_file=bad)
    assert info.value.body["param"] == "training_file"
    assert "line 13" in info.value.body["message"]
    assert _job_count(world) == 0


def test_too_few_examples_and_foreign_file_are_rejected(world):
    few = _upload(world.sdk(world.key_a), chat_lines(3))
    with pytest.raises(openai.BadRequestError) as info:
        world.sdk(world.key_a).fine_tuning.jobs.create(model=world.base_model, training_file=few)
    assert info.value.body["code"] == "too_few_examples"
    foreign = _upload(world.sdk(world.key_b), chat_lines(20))
    with pytest.raises(openai.BadRequestError) as info:
        world.sdk(world.key_a).fine_tuning.jobs.create(model=world.base_model, training_file=foreign)
    assert info.value.body["param"] == "training_file"
    assert _job_count(world) == 0


def test_malformed_json_body_is_400(world):
    response = world.http.post("/v1/fine_tuning/jobs", content=b'{"model": "x",',
                               headers={**world.headers(world.key_a), "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_idempotency_key_returns_same_job_and_409_on_different_body(world):
    sdk = world.sdk(world.key_a)
    training = _upload(sdk, chat_lines(20))
    headers = {"Idempotency-Key": "abc-123"}
    first = sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training, extra_headers=headers)
    second = sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training, extra_headers=headers)
    assert first.id == second.id
    with pytest.raises(openai.ConflictError):
        sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training, suffix="other",
                                    extra_headers=headers)
    assert _job_count(world) == 1


def test_list_filters_by_metadata_and_pages(world):
    sdk = world.sdk(world.key_a)
    training = _upload(sdk, chat_lines(20))
    ids = [sdk.fine_tuning.jobs.create(model=world.base_model, training_file=training,
                                       metadata={"team": "a" if i % 2 else "b"}).id for i in range(5)]
    assert [j.id for j in sdk.fine_tuning.jobs.list(limit=2)] == ids[::-1]
    page = sdk.fine_tuning.jobs.list(limit=2)
    assert len(page.data) == 2 and page.has_more
    team_a = [j.id for j in sdk.fine_tuning.jobs.list(metadata={"team": "a"})]
    assert team_a == [ids[3], ids[1]]


def test_cancel_and_cancel_again(world):
    sdk = world.sdk(world.key_a)
    job = sdk.fine_tuning.jobs.create(model=world.base_model, training_file=_upload(sdk, chat_lines(20)))
    assert sdk.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        sdk.fine_tuning.jobs.cancel(job.id)


def test_another_tenants_job_answers_404_everywhere(world):
    sdk = world.sdk(world.key_a)
    job = sdk.fine_tuning.jobs.create(model=world.base_model, training_file=_upload(sdk, chat_lines(20)))
    other = world.sdk(world.key_b)
    for call in (
        lambda: other.fine_tuning.jobs.retrieve(job.id),
        lambda: other.fine_tuning.jobs.cancel(job.id),
        lambda: other.fine_tuning.jobs.list_events(job.id),
        lambda: other.fine_tuning.jobs.checkpoints.list(job.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert other.fine_tuning.jobs.list().data == []
    response = world.http.get(f"/v1/fine_tuning/jobs/{job.id}/download", headers=world.headers(world.key_b))
    assert response.status_code == 404
    response = world.http.get(f"/v1/fine_tuning/jobs/{job.id}/events?stream=true", headers=world.headers(world.key_b))
    assert response.status_code == 404
    assert sdk.fine_tuning.jobs.retrieve(job.id).status == "validating_files"


def test_models_lists_base_models_in_openai_shape(world):
    models = world.sdk(world.key_a).models.list()
    assert [m.id for m in models.data] == ["tiny-base"]
    assert models.data[0].object == "model"
    with pytest.raises(openai.NotFoundError):
        world.sdk(world.key_a).models.retrieve("ft:nope")


def test_the_default_lora_rank_follows_the_model_size():
    from tuneforge.domain.job_config import TrainingType
    from tuneforge.planning.hyperparams import resolve_lora

    assert [resolve_lora(TrainingType(), n).rank for n in (230_000, 1_200_000_000, 8_000_000_000,
                                                            34_000_000_000, 70_000_000_000)] == [8, 16, 16, 32, 64]
    assert resolve_lora(TrainingType(), 70_000_000_000).alpha == 128
    assert resolve_lora(TrainingType(rank=4), 70_000_000_000).rank == 4  # asked for: kept


def test_gpu_requests_and_micro_batches_come_from_the_memory_model():
    from types import SimpleNamespace

    from tuneforge.domain.errors import ApiError
    from tuneforge.domain.job_config import JobRequest
    from tuneforge.planning import memory
    from tuneforge.services.training.planning import resolve_resources
    from tuneforge.settings import Settings

    llama_8b = memory.ModelShape.from_config({
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256})
    llama_70b = memory.ModelShape.from_config({
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 128256})
    settings = Settings(gpu_memory_gb=80, gpus_per_node=8)
    request = JobRequest(model="m", training_file="file-x")
    base = SimpleNamespace(num_parameters=None, size_bytes=0)
    lora_8b = resolve_resources(settings, request, base, "lora", llama_8b, seq_len=2048)
    full_8b = resolve_resources(settings, request, base, "full", llama_8b, seq_len=2048)
    full_70b = resolve_resources(settings, request, base, "full", llama_70b, seq_len=2048)
    assert lora_8b.gpus == 1
    assert full_8b.gpus > lora_8b.gpus
    assert full_70b.gpus >= 16 and full_70b.gpus_per_node == 8  # whole nodes
    assert not lora_8b.gradient_checkpointing and full_70b.gradient_checkpointing  # only where needed
    # several GPUs: sharded for a full fine-tune, replicated for an adapter whose base fits one GPU
    assert (lora_8b.strategy, full_8b.strategy, full_70b.strategy) == ("", "fsdp", "fsdp")
    four = JobRequest(model="m", training_file="file-x", resources={"gpus": 4})
    assert resolve_resources(settings, four, base, "lora", llama_8b, seq_len=2048).strategy == "ddp"
    assert resolve_resources(settings, four, base, "qlora", llama_70b, seq_len=2048).strategy == "ddp"
    lora_70b = resolve_resources(settings, request, base, "lora", llama_70b, seq_len=2048)
    assert lora_70b.gpus >= 2 and lora_70b.strategy == "fsdp"  # 140 GB of bf16 weights: sharded
    asked = JobRequest(model="m", training_file="file-x", resources={"gpus": 4}, distributed={"strategy": "fsdp"})
    assert resolve_resources(settings, asked, base, "lora", llama_8b, seq_len=2048).strategy == "fsdp"
    replicated = JobRequest(model="m", training_file="file-x", distributed={"strategy": "ddp"})
    with pytest.raises(ApiError) as refused:
        resolve_resources(settings, replicated, base, "full", llama_70b, seq_len=2048)
    assert refused.value.param == "distributed.strategy" and "fsdp" in refused.value.message
    with pytest.raises(ApiError) as refused:  # a 4-bit 70B base with its activations is over one 24 GB GPU
        resolve_resources(Settings(gpu_memory_gb=24), four, base, "qlora", llama_70b, seq_len=2048)
    assert refused.value.param == "resources.gpus" and "cannot be sharded" in refused.value.message
    choice = memory.choose_micro_batch(llama_8b, training_type="lora", seq_len=1024,
                                       memory_bytes=80 * memory.GIB, batch_size=32, max_micro_batch=8)
    assert choice.fits and choice.micro_batch_size * choice.gradient_accumulation_steps == 32
    small = memory.choose_micro_batch(llama_8b, training_type="lora", seq_len=1024,
                                      memory_bytes=40 * memory.GIB, batch_size=32, max_micro_batch=8)
    assert small.micro_batch_size < choice.micro_batch_size  # less memory: smaller micro-batches, more steps


def _refused(world, **change) -> dict:
    training = _upload(world.sdk(world.key_a), chat_lines(20))
    body = {"model": world.base_model, "training_file": training, **change}
    response = world.http.post("/v1/fine_tuning/jobs", json=body, headers=world.headers(world.key_a))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_an_unknown_parameter_is_answered_with_the_closest_known_name(world):
    error = _refused(world, method={"type": "supervised", "supervised": {"hyperparameters": {"epochs": 3}}})
    assert error["message"] == ("Unknown parameter(s): method.supervised.hyperparameters.epochs "
                                "(did you mean n_epochs?)")
    assert (error["param"], error["code"]) == ("method.supervised.hyperparameters.epochs", "unknown_parameter")
    nested = _refused(world, training_type={"type": "lora", "rnak": 4})
    assert nested["message"] == "Unknown parameter(s): training_type.rnak (did you mean rank?)"
    top = _refused(world, sufix="x")
    assert top["message"] == "Unknown parameter(s): sufix (did you mean suffix?)" and top["param"] == "sufix"
    nothing_close = _refused(world, frobnicate=True)
    assert nothing_close["message"] == "Unknown parameter(s): frobnicate"


def test_a_value_of_the_wrong_type_gets_one_plain_sentence(world):
    error = _refused(world, method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": "many"}}})
    assert error["message"] == ('method.supervised.hyperparameters.n_epochs must be an integer or "auto", '
                                'got "many"')
    assert (error["param"], error["code"]) == ("method.supervised.hyperparameters.n_epochs", "invalid_value")
    schedule = _refused(world, method={"type": "supervised", "supervised": {
        "hyperparameters": {"lr_scheduler_type": "exponential"}}})
    assert schedule["message"] == ('method.supervised.hyperparameters.lr_scheduler_type must be "linear", '
                                   '"cosine", "constant" or "auto", got "exponential"')


def test_an_unknown_model_names_the_closest_base_model_and_lists_them(world):
    error = _refused(world, model="tiny-bse")
    assert error["param"] == "model" and error["code"] == "model_not_available"
    assert error["message"] == ("Model 'tiny-bse' is not available for fine-tuning or does not exist; did you mean "
                                "'tiny-base'? Base models: tiny-base (GET /v1/models lists them with your "
                                "fine-tuned models)")
    assert "did you mean" not in _refused(world, model="zzzzzzzz")["message"]


def test_a_body_that_is_not_a_json_object_says_what_a_body_must_be(world):
    # `curl -d '{...}'` without `-H "Content-Type: application/json"` sends a form
    headers = {**world.headers(world.key_a), "Content-Type": "application/x-www-form-urlencoded"}
    for path in ("/v1/fine_tuning/jobs", "/v1/models/ft:x:y:z:w/promote"):
        response = world.http.post(path, content=b'{"stage": "staging"}', headers=headers)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"] == ("The request body must be a JSON object, sent with Content-Type: "
                                    "application/json") and error["code"] == "invalid_body"


def test_a_known_name_at_the_wrong_level_is_answered_with_where_it_belongs(world):
    error = _refused(world, n_epochs=3)  # a job file's hyperparameter written at the top
    assert error["message"] == "Unknown parameter(s): n_epochs (did you mean hyperparameters.n_epochs?)"
    assert _refused(world, rank=8)["message"] == "Unknown parameter(s): rank (did you mean training_type.rank?)"
    assert _refused(world, zzz=1)["message"] == "Unknown parameter(s): zzz"
