"""The official `tinker` SDK, unchanged, against a live control plane on 127.0.0.1: a supervised
loop learns, a saved state resumes exactly, a sampler of the trained weights differs from the
base's, an RL step runs, and two tenants training side by side on one base stay apart."""

from __future__ import annotations

import math
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
def sdk(request, monkeypatch):
    """`sdk(key)`: a ServiceClient of the `running` plane's; `sdk(key, world)`: of another plane's."""
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    made = []
    # the plane a test names starts first, so that it stops after the clients are closed
    default = request.getfixturevalue("running") if "running" in request.fixturenames else None

    def client(key: str, world=None):
        world = world if world is not None else default
        monkeypatch.setenv("TINKER_BASE_URL", f"{world.url}/tinker")
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


def _pool_attempts(world) -> list:
    """The co-training pools' attempts holding GPUs now: (job id, attempt number, handle, placement)."""
    from tuneforge.db.tables import Attempt, Job
    from tuneforge.services.training_api.scheduled import is_pool_job

    with world.plane.platform.db.session() as session:
        rows = session.query(Attempt, Job).join(Job, Job.job_id == Attempt.job_id) \
            .filter(Attempt.status.in_(("starting", "running"))).all()
        return [(a.job_id, a.number, dict(a.handle or {}), a.placement) for a, job in rows if is_pool_job(job)]


def _job_status(world, job_id: str) -> str:
    from tuneforge.db.tables import Job

    with world.plane.platform.db.session() as session:
        return session.query(Job).filter(Job.job_id == job_id).one().status


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.both_executors  # the worker is an attempt: launched, preempted and restarted by either executor
def test_a_preempted_worker_hands_back_every_models_state_and_the_next_one_goes_on_exactly(sdk, running) -> None:
    service = sdk(running.key_a)
    training = service.create_lora_training_client(base_model=BASE, rank=8, seed=5).result()
    for _ in range(5):
        step(training)
    path = training.save_state("before").result().path
    # the worker is an attempt of a job the scheduler placed: preempted as the scheduler preempts any
    # attempt (checkpoint-then-requeue, a reclaimed node), through its executor
    (job_id, number, handle, placement) = _pool_attempts(running)[0]
    assert placement["node"] and placement["gpu_ids"]  # it holds a GPU slot like any job
    running.plane.executor.signal(handle, "preempt")
    # requeued like any preempted job and started again; its new worker loads the kept state first
    _wait_for(lambda: any(attempt[:2] == (job_id, number + 1) for attempt in _pool_attempts(running)))
    preempted = [step(training) for _ in range(2)]
    assert [attempt[:2] for attempt in _pool_attempts(running)] == [(job_id, number + 1)]

    reference = service.create_training_client_from_state_with_optimizer(path).result()
    assert [step(reference) for _ in range(2)] == pytest.approx(preempted, rel=1e-6)


@pytest.fixture
def releasing(tmp_path, database_url, tiny_model_dir):
    """A plane whose training API lets idle models and workers go after a second (one GPU slot)."""
    from tests.e2e.conftest import start_plane

    world = start_plane(tmp_path / "releasing", database_url, tiny_model_dir, training_api_idle_s=1.0)
    yield world
    world.close()


@pytest.fixture
def process_workers(tmp_path, database_url, tiny_model_dir):
    """A plane whose co-training workers are processes of its own host (no scheduled job)."""
    from tests.e2e.conftest import start_plane

    world = start_plane(tmp_path / "process", database_url, tiny_model_dir, training_api_workers="process")
    yield world
    world.close()


def test_workers_can_be_processes_of_the_control_planes_host_instead(process_workers, sdk) -> None:
    world = process_workers
    training = sdk(world.key_a, world).create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
    losses = [step(training) for _ in range(4)]
    assert losses[-1] < losses[0]
    assert _pool_attempts(world) == []  # no job holds a slot for it
    assert len(world.plane.app.state.training_api._pools.processes) == 1


def test_the_worker_holds_its_gpu_slot_until_it_is_let_go_and_an_ordinary_job_waits_for_it(
        releasing, sdk, tmp_path) -> None:
    import threading

    from tests.e2e.test_lifecycle import wait_for
    from tuneforge.db.tables import JobEvent
    from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, chat_example, demo_facts, write_jsonl

    world = releasing  # one GPU slot
    training = sdk(world.key_a, world).create_lora_training_client(base_model=BASE, rank=8, seed=4).result()
    step(training)
    ((pool_job, _number, _handle, placement),) = _pool_attempts(world)
    assert placement["gpu_ids"] == [0]
    serving = threading.Event()
    serving.set()
    busy = threading.Thread(target=lambda: [step(training) for _ in iter(serving.is_set, False)], daemon=True)
    busy.start()  # the worker keeps serving (never idle) while an ordinary job is submitted
    openai_sdk = world.sdk(world.key_b)
    upload = openai_sdk.files.create(file=write_jsonl(tmp_path / "job.jsonl", [
        chat_example(fact) for fact in demo_facts(10)]).open("rb"), purpose="fine-tune")
    job = openai_sdk.fine_tuning.jobs.create(model=BASE, training_file=upload.id, seed=0, method={
        "type": "supervised", "supervised": {"hyperparameters": {**DEMO_HYPERPARAMETERS, "n_epochs": 1}}})
    _wait_for(lambda: openai_sdk.fine_tuning.jobs.retrieve(job.id).status != "validating_files")
    time.sleep(3.0)  # fifteen scheduler ticks: the job cannot take the slot the worker holds
    assert openai_sdk.fine_tuning.jobs.retrieve(job.id).status == "queued"
    assert [attempt[0] for attempt in _pool_attempts(world)] == [pool_job]
    serving.clear()
    busy.join(30)
    # no more requests: the model is let go (its state kept), then the idle worker; its job ends and
    # the ordinary job gets the slot
    job = wait_for(openai_sdk, job.id)
    assert job.status == "succeeded", job.error
    assert _job_status(world, pool_job) == "cancelled"
    with world.plane.platform.db.session() as session:
        def first(job_id: str, text: str) -> int:
            return min(e.pk for e in session.query(JobEvent).filter(JobEvent.job_id == job_id) if text in e.message)
        assert first(pool_job, "Co-training pool stopped: idle") < first(job.id, "started")
    step(training)  # and the model comes back where it was, on a new worker that waits for the slot


def test_an_idle_model_is_released_its_worker_stops_and_both_come_back_where_they_were(releasing, sdk) -> None:
    world = releasing
    service = sdk(world.key_a, world)
    training = service.create_lora_training_client(base_model=BASE, rank=8, seed=6).result()
    for _ in range(4):
        step(training)
    path = training.save_state("before-idle").result().path
    (job_id, *_rest) = _pool_attempts(world)[0]
    _wait_for(lambda: not _pool_attempts(world), 30.0)  # released, then the idle worker stopped
    assert _job_status(world, job_id) == "cancelled"  # its job ended as the platform's, not failed
    broker = world.plane.app.state.training_api.api().broker
    assert broker.models[training.model_id].state_key is not None
    after_idle = [step(training) for _ in range(2)]
    reference = service.create_training_client_from_state_with_optimizer(path).result()
    assert [step(reference) for _ in range(2)] == pytest.approx(after_idle, rel=1e-6)


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


def test_a_training_api_checkpoint_registered_as_a_model_chats_downloads_stays_in_dev_and_is_continued(
        releasing, sdk, tmp_path) -> None:
    running = releasing
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
    training = sdk(running.key_a, running).create_lora_training_client(base_model=BASE, rank=8, seed=5).result()
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

    # nothing evaluated it: it stays in dev (a job that continues it evaluates what it trains)
    refused = api(running.key_a, "POST", f"/v1/models/{model['id']}/promote", json={"stage": "staging"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_not_evaluated", refused.text

    # continued by an ordinary job: the adapter's shape kept, its weights the starting point (on
    # the plane's one GPU slot, once the idle co-training worker has let it go)
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


def test_a_control_plane_with_several_api_workers_serves_the_training_api_from_one_process(
        tmp_path, database_url, tiny_model_dir, monkeypatch) -> None:
    """`tuneforge serve` with two API worker processes on one socket: the SDK's requests land on
    either, which forward them to the parent holding the training API (api/forward.py)."""
    from tests.e2e.test_restart import ServeProcess, serve_env
    from tests.helpers.net import free_port
    from tests.helpers.platform import add_tenant, make_platform
    from tuneforge.db.migrate import upgrade
    from tuneforge.services.serving import base_models as base_model_service

    port = free_port()
    home = tmp_path / "home"
    upgrade(database_url)
    platform = make_platform(tmp_path, database_url)  # the same home: its object store is the plane's
    try:
        with platform.db.session() as session:
            base_model_service.add_base_model(session, platform.store, BASE, str(tiny_model_dir), tmp_path / "hub")
        key = add_tenant(platform, "acme")
    finally:
        platform.db.dispose()
    plane = ServeProcess(serve_env(home, database_url, port, api_workers=2, local_gpus=1), port,
                         tmp_path / "serve.log")
    plane.start()
    service = None
    try:
        monkeypatch.setenv("TINKER_BASE_URL", f"{plane.url}/tinker")
        monkeypatch.setenv("TINKER_API_KEY", f"tml-{key}")
        monkeypatch.setenv("TINKER_TELEMETRY", "0")
        service = tinker.ServiceClient()
        training = service.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
        losses = [step(training) for _ in range(6)]  # a dozen requests and their futures, over both workers
        assert losses[-1] < losses[0], plane.log_tail()
        path = training.save_state("served").result().path
        resumed = service.create_training_client_from_state_with_optimizer(path).result()
        assert resumed.get_info().model_data.model_name == BASE
        wrong = httpx.post(f"{plane.url}/tinker/api/v1/create_session", headers={"X-API-Key": "tml-tf-wrong"},
                           json={}, trust_env=False)
        assert wrong.status_code == 401
        # every answer comes from a worker, whose parent runs the scheduler: /healthz says so
        health = [httpx.get(f"{plane.url}/healthz", trust_env=False).json() for _ in range(6)]
        assert {answer["scheduler"] for answer in health} == {"parent"}, health
        started = plane.log_tail(20000)  # what `serve` said first: its home, and where the console is
        assert f"home {home.resolve()}" in started and f"console: {plane.url}/console" in started
        assert "Traceback" not in plane.log_tail(20000)
    finally:
        try:
            if service is not None:
                service.close("success").result(timeout=30)
        finally:
            plane.stop()  # whatever the client did: no server outlives the test
