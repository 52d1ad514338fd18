"""The official `tinker` SDK, unchanged, against a live control plane on 127.0.0.1: a supervised
loop learns, a saved state resumes exactly, a sampler of the trained weights differs from the
base's, an RL step runs, and two tenants training side by side on one base stay apart."""

from __future__ import annotations

import math
import signal
import time

import httpx
import pytest
from transformers import AutoTokenizer

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.sqlite_pass_only  # its database work (metering) is covered on both backends elsewhere

BASE = "tiny-chat"
ADAM = types.AdamParams(learning_rate=2e-2)


@pytest.fixture
def sdk(running, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", f"{running.url}/tinker")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")

    made = []

    def client(key: str):
        monkeypatch.setenv("TINKER_API_KEY", f"tml-{key}")
        made.append(tinker.ServiceClient())
        return made[-1]

    yield client
    for service in made:  # the session ends (the SDK's heartbeats stop) before the plane does
        service.close("success").result(timeout=30)


def supervised(tokens: list[int]) -> types.Datum:
    """Next-token prediction over `tokens`: the input all but the last, targets shifted by one."""
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


DATA = [supervised([5 + i, 9, 14, 3 + i, 22, 7, 30 + i, 11]) for i in range(4)]


def step(client, data=DATA) -> float:
    result = client.forward_backward(data, "cross_entropy").result()
    client.optim_step(ADAM).result()
    return result.metrics["loss:sum"]


def test_a_supervised_loop_learns_resumes_exactly_and_samples_its_own_weights(sdk, running) -> None:
    service = sdk(running.key_a)
    training = service.create_lora_training_client(base_model=BASE, rank=8, seed=3).result()
    assert training.get_info().model_data.model_name == BASE
    tokenizer = training.get_tokenizer()  # the base's own, from where it was registered
    assert tokenizer.encode("hello world") == AutoTokenizer.from_pretrained(running.model_dir).encode("hello world")
    losses = [step(training) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses

    path = training.save_state("after-30").result().path
    assert path == f"tinker://{training.model_id}/weights/after-30"
    uninterrupted = [step(training) for _ in range(2)]

    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.model_id != training.model_id
    assert [step(resumed) for _ in range(2)] == pytest.approx(uninterrupted, rel=1e-6)

    # the trained weights sample differently from the base, with a logprob per token
    prompt = types.ModelInput.from_ints([5, 9, 14, 3])
    params = types.SamplingParams(max_tokens=6, seed=11, temperature=1.0, stop=[])
    sampler = training.save_weights_and_get_sampling_client().result()
    base_sampler = service.create_sampling_client(base_model=BASE)
    trained = sampler.sample(prompt, 2, params).result()
    base = base_sampler.sample(prompt, 2, params).result()
    assert [s.tokens for s in sampler.sample(prompt, 2, params).result().sequences] == \
        [s.tokens for s in trained.sequences]  # the same seed: the same samples
    assert [len(s.tokens) for s in trained.sequences] == [6, 6]
    assert all(len(s.logprobs) == 6 and all(lp <= 0 for lp in s.logprobs) for s in trained.sequences)
    assert [s.logprobs for s in trained.sequences] != [s.logprobs for s in base.sequences]
    # the trained model learned DATA's continuation: after 5 9 14 3 comes 22 far likelier than in the base
    scored = sampler.compute_logprobs(types.ModelInput.from_ints([5, 9, 14, 3, 22])).result()
    base_scored = base_sampler.compute_logprobs(types.ModelInput.from_ints([5, 9, 14, 3, 22])).result()
    assert scored[0] is None and scored[-1] > base_scored[-1] + 1.0

    # an RL step: importance sampling on sampled tokens with their sampler logprobs
    sequence = trained.sequences[0]
    tokens = [5, 9, 14, 3, *sequence.tokens]
    rl = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                     loss_fn_inputs={"target_tokens": tokens[1:],
                                     "logprobs": [0.0] * 3 + list(sequence.logprobs),
                                     "advantages": [0.0] * 3 + [1.0] * len(sequence.tokens)})
    out = training.forward_backward([rl], "importance_sampling").result()
    assert math.isfinite(out.metrics["loss:sum"])
    assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(tokens) - 1
    training.optim_step(ADAM).result()

    # a loss the SDK names but this platform does not serve: a clear 400 naming it
    with pytest.raises(tinker.BadRequestError, match="dro"):
        training.forward_backward(DATA, "dro").result()


def test_two_tenants_train_on_one_base_apart_and_each_is_metered_for_its_own_tokens(sdk, running) -> None:
    alice_service = sdk(running.key_a)
    alice = alice_service.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()
    probe = [supervised([40, 41, 42, 43, 44, 45])]
    before = alice.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()

    bob_service = sdk(running.key_b)
    bob = bob_service.create_lora_training_client(base_model=BASE, rank=16, seed=2).result()
    for _ in range(3):  # both models' requests share the worker's cycles
        alice_future = alice.forward_backward(probe, "cross_entropy")
        step(bob)
        alice_future.result()
    after = alice.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert after == before  # bob's steps changed nothing of alice's model (she took no optimizer step)

    path = alice.save_state("mine").result().path
    with pytest.raises(tinker.NotFoundError):  # bob can neither load nor sample alice's checkpoint
        bob_service.create_training_client_from_state(path).result()
    with pytest.raises(tinker.NotFoundError):
        bob_service.create_sampling_client(model_path=path).result()
    with pytest.raises(tinker.NotFoundError):  # nor drive her model
        bob_service.create_rest_client().get_training_run(alice.model_id).result()

    def trained_tokens(key: str) -> dict[str, int]:
        rows = httpx.get(f"{running.url}/v1/usage", headers={"Authorization": f"Bearer {key}"}).json()["tokens"]
        assert all(row["device_seconds"] > 0 for row in rows if row["kind"] == "training.train")  # its share
        return {row["job_id"]: row["prompt_tokens"] for row in rows if row["kind"] == "training.train"}

    bob_tokens = sum(len(d.model_input.to_ints()) for d in DATA) * 3
    alice_tokens = len(probe[0].model_input.to_ints()) * 3
    assert trained_tokens(running.key_b) == {bob.model_id: bob_tokens}
    assert trained_tokens(running.key_a) == {alice.model_id: alice_tokens}  # forward passes are not billed


def _workers(running) -> dict:
    return running.plane.app.state.training_api._pools.processes


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_preempted_worker_hands_back_every_models_state_and_the_next_one_goes_on_exactly(sdk, running) -> None:
    service = sdk(running.key_a)
    training = service.create_lora_training_client(base_model=BASE, rank=8, seed=5).result()
    for _ in range(5):
        step(training)
    path = training.save_state("before").result().path
    (process,) = _workers(running).values()
    process.send_signal(signal.SIGTERM)  # as a scheduler preempting it would
    process.wait(60)
    _wait_for(lambda: not _workers(running))
    preempted = [step(training) for _ in range(2)]  # a new worker loads the kept state first
    assert len(_workers(running)) == 1 and next(iter(_workers(running).values())).pid != process.pid

    reference = service.create_training_client_from_state_with_optimizer(path).result()
    assert [step(reference) for _ in range(2)] == pytest.approx(preempted, rel=1e-6)


def test_an_idle_model_is_released_its_worker_stops_and_both_come_back_where_they_were(
        tmp_path, database_url, tiny_model_dir, monkeypatch) -> None:
    from tests.e2e.conftest import start_plane

    world = start_plane(tmp_path, database_url, tiny_model_dir, training_api_idle_s=1.0)
    closing: list = []
    try:
        monkeypatch.setenv("TINKER_BASE_URL", f"{world.url}/tinker")
        monkeypatch.setenv("TINKER_API_KEY", f"tml-{world.key_a}")
        monkeypatch.setenv("TINKER_TELEMETRY", "0")
        service = tinker.ServiceClient()
        training = service.create_lora_training_client(base_model=BASE, rank=8, seed=6).result()
        closing.append(service)
        for _ in range(4):
            step(training)
        path = training.save_state("before-idle").result().path
        _wait_for(lambda: not _workers(world), 30.0)  # released, then the idle worker stopped
        broker = world.plane.app.state.training_api.api().broker
        assert broker.models[training.model_id].state_key is not None
        after_idle = [step(training) for _ in range(2)]
        reference = service.create_training_client_from_state_with_optimizer(path).result()
        assert [step(reference) for _ in range(2)] == pytest.approx(after_idle, rel=1e-6)
    finally:
        for service in closing:
            service.close("success").result(timeout=30)
        world.close()


def test_forward_backward_custom_runs_its_loss_on_the_client_and_trains_through_weighted_cross_entropy(
        sdk, running) -> None:
    import torch

    training = sdk(running.key_a).create_lora_training_client(base_model=BASE, rank=8, seed=9).result()

    def squared(data, logprobs_list):  # any differentiable function of the target logprobs
        loss = sum((lp ** 2).sum() for lp in logprobs_list)
        return loss, {"squares:sum": float(loss)}

    first = training.forward_backward_custom(DATA, squared).result()
    expected = sum(float((torch.tensor(out["logprobs"].tolist()) ** 2).sum())
                   for out in training.forward(DATA, "cross_entropy").result().loss_fn_outputs)
    assert first.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
    assert first.metrics["squares:sum"] == pytest.approx(expected, rel=1e-4)
    training.optim_step(ADAM).result()
    second = training.forward_backward_custom(DATA, squared).result()
    assert second.metrics["loss:sum"] < first.metrics["loss:sum"]  # the step followed the custom loss down


def test_a_training_api_checkpoint_registered_as_a_model_chats_downloads_promotes_and_is_continued(
        sdk, running, tmp_path) -> None:
    from tests.e2e.test_lifecycle import wait_for
    from tuneforge.data.tokenize import IGNORE_INDEX, tokenize_example
    from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, chat_example, demo_facts, write_jsonl
    from tuneforge.demo.evaluate import load_finetuned, mapping_accuracy
    from tuneforge.services.training.artifacts import extract

    examples = [chat_example(fact) for fact in demo_facts(4, seed=3)]
    tokenizer = AutoTokenizer.from_pretrained(running.model_dir)
    data = []
    for example in examples:  # the chat template as a job renders it: the loss on the reply only
        tokens = tokenize_example(example, tokenizer, max_seq_length=256)
        weights = [float(label != IGNORE_INDEX) for label in tokens.labels[1:]]
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens.input_ids[:-1]),
                                loss_fn_inputs={"target_tokens": tokens.input_ids[1:], "weights": weights}))
    weighted = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in data)
    training = sdk(running.key_a).create_lora_training_client(base_model=BASE, rank=8, seed=5).result()
    adam = types.AdamParams(learning_rate=5e-3)
    losses = []
    for _ in range(60):
        losses.append(training.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] / weighted)
        training.optim_step(adam).result()
    assert losses[-1] < 0.05 * losses[0], losses
    path = training.save_weights_for_sampler("learned").result().path

    def api(key: str, method: str, url: str, **kwargs) -> httpx.Response:
        return httpx.request(method, f"{running.url}{url}", headers={"Authorization": f"Bearer {key}"},
                             timeout=60, **kwargs)

    answer = api(running.key_a, "POST", "/v1/models", json={"source": path, "suffix": "loop"})
    assert answer.status_code == 200, answer.text
    model = answer.json()
    assert model["id"].startswith("ft:tiny-chat:") and ":loop:" in model["id"], model["id"]
    assert (model["job_id"], model["stage"], model["artifact"]) == (None, "dev", "adapter")
    lineage = model["lineage"]
    assert (lineage["training_run"], lineage["checkpoint"], lineage["lora"]["rank"]) == (training.model_id, path, 8)
    assert set(lineage["artifact"]["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    # the same checkpoint again: the same model; another tenant's path, or a bad one: refused by name
    assert api(running.key_a, "POST", "/v1/models", json={"source": path}).json()["id"] == model["id"]
    other = api(running.key_b, "POST", "/v1/models", json={"source": path})
    assert other.status_code == 404 and other.json()["error"]["param"] == "source"
    bad = api(running.key_a, "POST", "/v1/models", json={"source": "/etc/passwd"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "source"
    assert api(running.key_b, "GET", f"/v1/models/{model['id']}").status_code == 404

    # chat: the registered model answers what the loop taught it, the base does not
    openai_sdk = running.sdk(running.key_a)

    def replies(name: str) -> list[str]:
        return [openai_sdk.chat.completions.create(model=name, messages=e["messages"][:2], max_tokens=8,
                                                   temperature=0).choices[0].message.content.strip()
                for e in examples]

    codes = [e["messages"][2]["content"] for e in examples]
    assert replies(model["id"]) == codes
    assert replies(BASE) != codes

    # download: a PEFT adapter that loads on the base and gives the same answers
    archive = api(running.key_a, "GET", f"/v1/models/{model['id']}/download")
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/gzip"
    assert api(running.key_b, "GET", f"/v1/models/{model['id']}/download").status_code == 404
    (tmp_path / "model.tar.gz").write_bytes(archive.content)
    peft_model, peft_tokenizer = load_finetuned(running.model_dir, extract(tmp_path / "model.tar.gz", tmp_path / "x"))
    assert mapping_accuracy(peft_model, peft_tokenizer, examples) == 1.0

    # promoted through the stages like any model (this plane evaluates no model by default: no gate)
    promoted = api(running.key_a, "POST", f"/v1/models/{model['id']}/promote", json={"stage": "staging"})
    assert promoted.status_code == 200 and promoted.json()["stage"] == "staging", promoted.text

    # continued by an ordinary job: the adapter's shape kept, its weights the starting point
    upload = openai_sdk.files.create(file=write_jsonl(tmp_path / "again.jsonl", examples * 3).open("rb"),
                                     purpose="fine-tune")
    job = openai_sdk.fine_tuning.jobs.create(
        model=model["id"], training_file=upload.id, seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": {**DEMO_HYPERPARAMETERS, "n_epochs": 1}}})
    assert job.model_extra["parent"] == {"model": model["id"], "job_id": None, "step": None}
    shown = job.model_extra["training_type"]
    assert (shown["rank"], shown["alpha"]) == (8, lineage["lora"]["alpha"])
    job = wait_for(openai_sdk, job.id)
    assert job.status == "succeeded", job.error
    assert any(e.message.startswith("the adapter starts from the parent's")
               for e in openai_sdk.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e for e in openai_sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
    first = min(metrics, key=lambda e: e.data["step"]).data["train_loss"]
    assert first < 0.2 * losses[0], (first, losses[0])  # it knew the data before its first step
