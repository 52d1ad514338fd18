"""Continuous batching on the tiny Llama: requests for different adapters of one base (and the base
alone) decoded in one forward pass give the tokens and log probabilities each gets alone; sequences
join and leave the batch at different steps; seeded sampling with the vLLM extensions repeats; full
fine-tunes batch among themselves; the queue is bounded (429 with Retry-After, per tenant too) and
admits tenants in turn."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from tests.helpers.archs import ARCHITECTURES, build_arch_model
from tests.helpers.lora import stage_adapter, stage_base
from tests.unit.serve.test_engine import PROMPT, adapter_dirs, world  # noqa: F401 - the fixtures
from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.domain.errors import ApiError
from tuneforge.serve.engine import InferenceEngine
from tuneforge.serve.generation import adjusted_logits
from tuneforge.serve.params import FULL_MODEL, Completion, ModelTarget, Prompt, SamplingParams
from tuneforge.serve.sinks import Sink, completion_of
from tuneforge.storage.store import open_store

LOGPROB_TOLERANCE = 1e-4
PROMPTS = [PROMPT, "hello there", "a b c d e f g h i j k l m n o p q r s t u v w x y z", "x = 1\ny ="]


def _held(engine: InferenceEngine, target: ModelTarget) -> tuple[threading.Event, threading.Thread]:
    """The model's batcher kept busy until the returned event is set: requests submitted meanwhile
    wait, then are admitted together."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(60)

    engine.complete(target, Prompt(text="warm"), SamplingParams(max_new_tokens=1))  # loads the model
    batcher = engine._batcher(engine._model(target))
    thread = threading.Thread(target=batcher.call, args=(hold,), daemon=True)
    thread.start()
    assert started.wait(30)
    return release, thread


def _alone_and_batched(make_engine: Callable, requests: list, max_batch: int) -> tuple[list, list, InferenceEngine]:
    """The requests answered one at a time, then submitted together to an engine of `max_batch`
    whose batcher is held until all wait (they start together); both answers and that engine."""
    alone_engine = make_engine(max_batch=1)
    alone = [alone_engine.complete(*request) for request in requests]
    engine = make_engine(max_batch=max_batch)
    release, holder = _held(engine, requests[0][0])
    sinks = [engine.submit(*request) for request in requests]
    release.set()
    batched = _collect(sinks)
    holder.join(30)
    return alone, batched, engine


def _collect(sinks: list[Sink]) -> list[Completion]:
    return [sink.completion() for sink in sinks]


def _requests(world, count: int) -> list[tuple[ModelTarget, Prompt, SamplingParams]]:  # noqa: F811
    _make_engine, base, targets, _store = world
    order = [targets["a"], targets["b"], base, targets["c"]]
    requests = []
    for index in range(count):
        # lengths differ, so sequences leave the batch at different steps
        params = SamplingParams(max_new_tokens=6 + 3 * (index % 5), temperature=0.0, logprobs=2)
        requests.append((order[index % len(order)], Prompt(text=PROMPTS[index % len(PROMPTS)]), params))
    return requests


def _assert_same(batched: list[Completion], alone: list[Completion]) -> None:
    for index, (got, expected) in enumerate(zip(batched, alone)):
        assert got.text == expected.text, index
        assert (got.finish_reason, got.usage) == (expected.finish_reason, expected.usage), index
        assert [e["token"] for e in got.logprobs] == [e["token"] for e in expected.logprobs], index
        for mine, theirs in zip(got.logprobs, expected.logprobs):
            assert abs(mine["logprob"] - theirs["logprob"]) < LOGPROB_TOLERANCE, index
            assert [t["token"] for t in mine["top_logprobs"]] == [t["token"] for t in theirs["top_logprobs"]]


def test_mixed_adapters_in_one_batch_equal_each_request_alone(world):  # noqa: F811
    requests = _requests(world, 12)
    alone, batched, engine = _alone_and_batched(world[0], requests, 8)  # all wait; 8 start together
    assert len({c.text for c in alone}) >= 4  # the adapters and prompts really differ
    _assert_same(batched, alone)
    stats = engine.stats()
    assert stats["largest_batch"] == 8
    assert stats["base_loads"] == 1 and stats["adapter_loads"] == 3
    # 8 together, then the others joined as the short ones left: fewer steps than tokens
    produced = sum(c.usage.completion_tokens for c in batched)
    assert stats["decode_steps"] < produced - len(requests)


def test_sequences_join_a_running_batch_between_steps(world):  # noqa: F811
    make_engine = world[0]
    requests = _requests(world, 6)
    alone = [make_engine(max_batch=1).complete(*request) for request in requests]
    engine = make_engine(max_batch=16)
    results: dict[int, Completion] = {}
    started = threading.Barrier(len(requests))

    def ask(index: int) -> None:
        started.wait()
        target, prompt, params = requests[index]
        # half stream, half wait for the whole answer; they arrive while others decode
        if index % 2:
            chunks = list(engine.stream(target, prompt, params))
            results[index] = completion_of(chunks)
        else:
            results[index] = engine.complete(target, prompt, params)

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    _assert_same([results[index] for index in range(len(requests))], alone)


def test_seeded_sampling_with_the_extensions_repeats_in_a_batch(world):  # noqa: F811
    make_engine, base, targets, _store = world
    params = [SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=40, seed=seed,
                             repetition_penalty=1.3) for seed in (1, 2, 3)]
    params.append(SamplingParams(max_new_tokens=10, temperature=0.7, seed=4, min_tokens=10, ignore_eos=True))
    chosen = [targets["a"], targets["b"], base, targets["a"]]
    requests = [(target, Prompt(text=PROMPT), p) for target, p in zip(chosen, params)]
    alone, batched, _engine = _alone_and_batched(make_engine, requests, 4)
    assert [c.text for c in batched] == [c.text for c in alone]
    assert batched[3].usage.completion_tokens == 10  # ignore_eos: the whole budget
    assert len({c.text for c in batched[:3]}) == 3


def test_the_extensions_change_the_logits_as_vllm_defines_them():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    eos = frozenset({3})
    penalised = adjusted_logits(logits, SamplingParams(1, repetition_penalty=2.0), torch.tensor([0, 1]), 0, eos)
    assert penalised.tolist() == [1.0, -2.0, 0.5, 3.0, -2.0]  # positive divided, negative multiplied
    early = adjusted_logits(logits, SamplingParams(1, min_tokens=2), None, 1, eos)
    assert early[3] == float("-inf") and early[0] == 2.0
    assert adjusted_logits(logits, SamplingParams(1, min_tokens=2), None, 2, eos)[3] == 3.0
    assert adjusted_logits(logits, SamplingParams(1, min_tokens=2, ignore_eos=True), None, 0, eos)[3] == 3.0
    top = adjusted_logits(logits, SamplingParams(1, top_k=2), None, 0, eos)
    assert torch.isfinite(top).tolist() == [True, False, False, True, False]
    greedy = adjusted_logits(logits, SamplingParams(1, top_k=2, temperature=0.0), None, 0, eos)
    assert torch.equal(greedy, logits)  # top_k changes nothing for argmax


def test_full_fine_tunes_batch_among_themselves(world, tmp_path):  # noqa: F811
    make_engine, base, _targets, store = world
    full_dir = build_tiny_model(tmp_path / "full", seed=11)
    staged = stage_adapter(store, base.base, full_dir, tenant_id="tenant-a", job_id="ftjob-full", kind=FULL_MODEL)
    full = ModelTarget(staged.name, base.base, artifact_prefix=staged.artifact_prefix, artifact_kind=FULL_MODEL)
    requests = [(full, Prompt(text=text), SamplingParams(max_new_tokens=5 + index, temperature=0.0, logprobs=1))
                for index, text in enumerate(PROMPTS)]
    alone, batched, engine = _alone_and_batched(make_engine, requests, 4)
    _assert_same(batched, alone)
    assert engine.stats()["largest_batch"] == 4 and engine.stats()["adapter_loads"] == 0


def test_a_full_queue_answers_429_with_retry_after_and_a_tenant_gets_only_its_share(world):  # noqa: F811
    make_engine, base, _targets, _store = world
    engine = make_engine(max_queue=3, max_queue_per_tenant=2)
    release, holder = _held(engine, base)
    params = SamplingParams(max_new_tokens=2, temperature=0.0)
    acme = engine.for_tenant("acme")
    waiting = [acme.submit(base, Prompt(text="one"), params), acme.submit(base, Prompt(text="two"), params)]
    with pytest.raises(ApiError) as share:
        acme.submit(base, Prompt(text="three"), params)
    assert (share.value.status_code, share.value.code) == (429, "engine_overloaded")
    assert share.value.retry_after is not None and share.value.retry_after >= 1
    waiting.append(engine.for_tenant("globex").submit(base, Prompt(text="four"), params))  # globex has room
    with pytest.raises(ApiError) as full:
        engine.for_tenant("initech").submit(base, Prompt(text="five"), params)
    assert full.value.status_code == 429
    release.set()
    assert all(c.usage.completion_tokens >= 1 for c in _collect(waiting))  # nothing waiting was lost
    holder.join(30)
    assert engine.stats()["queue_full"] == 2


def test_waiting_tenants_are_admitted_in_turn(world, monkeypatch):  # noqa: F811
    make_engine, base, _targets, _store = world
    engine = make_engine(max_batch=1, max_queue=16, max_queue_per_tenant=8)
    release, holder = _held(engine, base)
    batcher = engine._batcher(engine._model(base))
    admitted: list[str] = []
    prefill: Callable = batcher._prefill

    def recording(requests):  # noqa: ANN001, ANN202
        admitted.extend(request.tenant for request in requests)
        return prefill(requests)

    monkeypatch.setattr(batcher, "_prefill", recording)
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    sinks = [engine.for_tenant("acme").submit(base, Prompt(text=f"a{i}"), params) for i in range(4)]
    sinks += [engine.for_tenant("globex").submit(base, Prompt(text=f"g{i}"), params) for i in range(2)]
    sinks.append(engine.for_tenant("initech").submit(base, Prompt(text="i0"), params))
    release.set()
    _collect(sinks)
    holder.join(30)
    assert admitted == ["acme", "globex", "initech", "acme", "globex", "acme", "acme"]


def test_an_adapter_in_use_is_not_evicted_and_a_request_waits_for_a_slot(world):  # noqa: F811
    make_engine, _base, targets, _store = world
    requests = [(targets[name], Prompt(text=PROMPT), SamplingParams(max_new_tokens=8, temperature=0.0))
                for name in ("a", "b", "c")]
    # c waits until a or b leaves the batch, then takes its slot
    alone, batched, engine = _alone_and_batched(lambda **kwargs: make_engine(max_adapters=2, **kwargs), requests, 8)
    assert [c.text for c in batched] == [c.text for c in alone]
    stats = engine.stats()
    assert stats["adapter_loads"] == 3 and stats["adapter_evictions"] == 1 and stats["largest_batch"] == 2


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_architecture_decodes_the_same_in_a_batch(arch, tmp_path):
    """Learned positions (gpt2), rotary ones, sliding windows shorter than the sequences (mistral,
    gemma2 with eager attention, gemma3's mix of local and global layers), experts: in a padded
    batch whose members join at different steps, each sequence gets its tokens and log
    probabilities alone."""
    store = open_store(str(tmp_path / "objects"))
    model_dir = build_arch_model(arch, tmp_path / "model")
    base = ModelTarget(arch, stage_base(store, model_dir, name=arch, sha256=f"{len(arch):064d}"))
    # a prompt and a completion longer than the 16-token windows
    requests = [(Prompt(text=text), SamplingParams(max_new_tokens=12 + 4 * index, temperature=0.0, logprobs=1,
                                                    ignore_eos=True))
                for index, text in enumerate(PROMPTS)]
    alone_engine = InferenceEngine(store, cache_dir=tmp_path / "cache", device="cpu", max_batch=1)
    alone = [alone_engine.complete(base, prompt, params) for prompt, params in requests]
    engine = InferenceEngine(store, cache_dir=tmp_path / "cache", device="cpu", max_batch=8)
    release, holder = _held(engine, base)
    sinks = [engine.submit(base, prompt, params) for prompt, params in requests[:2]]
    release.set()
    running = iter(sinks[0])
    first = [next(running)]  # the batch is running: the others join it
    sinks += [engine.submit(base, prompt, params) for prompt, params in requests[2:]]
    batched = [completion_of(first + list(running))] + _collect(sinks[1:])
    holder.join(30)
    _assert_same(batched, alone)
    assert engine.stats()["largest_batch"] >= 3


def test_without_the_stacked_adapters_pefts_mixed_batches_give_the_same(world, monkeypatch):  # noqa: F811
    """A loaded adapter the stacks cannot hold (DoRA, LoRA on embeddings) leaves the computation to
    PEFT's own mixed-adapter forward: the same tokens and log probabilities."""
    from tuneforge.serve.lora_bank import LoraBank

    monkeypatch.setattr(LoraBank, "prepare", lambda self, adapters: False)
    alone, batched, engine = _alone_and_batched(world[0], _requests(world, 8), 8)
    _assert_same(batched, alone)
    assert engine.stats()["largest_batch"] == 8


def test_a_failing_step_fails_its_batch_not_the_engine(world, monkeypatch):  # noqa: F811
    make_engine, base, targets, _store = world
    engine = make_engine(max_batch=4)
    release, holder = _held(engine, base)
    batcher = engine._batcher(engine._model(base))
    run_model = batcher.run_model
    broken = {"steps": 1}

    def flaky(adapters, **inputs):  # noqa: ANN001, ANN202
        if inputs["input_ids"].shape[1] == 1 and broken["steps"]:  # the first decoding step breaks
            broken["steps"] -= 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return run_model(adapters, **inputs)

    monkeypatch.setattr(batcher, "run_model", flaky)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    sinks = [engine.submit(target, Prompt(text=PROMPT), params) for target in (base, targets["a"], targets["b"])]
    release.set()
    for sink in sinks:
        with pytest.raises(ApiError) as failed:
            list(sink)
        assert (failed.value.status_code, failed.value.code) == (500, "internal_error")
        assert "illegal memory" not in failed.value.message  # the cause is in the operator's log only
    holder.join(30)
    again = engine.complete(targets["a"], Prompt(text=PROMPT), params)
    assert again.usage.completion_tokens >= 1


def test_many_adapters_of_large_rank_gather_each_rows_own_weights(world, monkeypatch):  # noqa: F811
    """Past DENSE_LIMIT (slots x rank) a mixed batch gathers each row's A and B instead of
    multiplying by every adapter's: the same tokens and log probabilities."""
    from tuneforge.serve import lora_bank

    monkeypatch.setattr(lora_bank, "DENSE_LIMIT", 0)
    alone, batched, engine = _alone_and_batched(world[0], _requests(world, 8), 8)
    _assert_same(batched, alone)
    assert engine.stats()["largest_batch"] == 8


def _admissions(batcher, monkeypatch) -> list[tuple[list[str], int]]:  # noqa: ANN001
    """Each prefill from now on, as (its members, 'tenant' or 'tenant+' for a resumed row, and the
    rows running beside it)."""
    admitted: list[tuple[list[str], int]] = []
    prefill: Callable = batcher._prefill

    def recording(requests):  # noqa: ANN001, ANN202
        members = [request.tenant + ("+" if request.resume is not None else "") for request in requests]
        admitted.append((members, len(batcher._rows)))
        return prefill(requests)

    monkeypatch.setattr(batcher, "_prefill", recording)
    return admitted


def _saturated(engine: InferenceEngine, base: ModelTarget, rows: int) -> tuple[list[Sink], object]:
    """`acme` fills every row of the batch with greedy ignore_eos requests; returns their sinks
    once they run, and the batcher."""
    release, holder = _held(engine, base)
    batcher = engine._batcher(engine._model(base))
    params = SamplingParams(max_new_tokens=16, temperature=0.0, logprobs=1, ignore_eos=True)
    sinks = [engine.for_tenant("acme").submit(base, Prompt(text=PROMPTS[index % len(PROMPTS)]), params)
             for index in range(rows)]
    release.set()
    holder.join(30)
    deadline_s = time.monotonic() + 30
    while batcher.load()["running"] < rows:  # every acme row has been prefilled
        assert time.monotonic() < deadline_s
        time.sleep(0.001)
    return sinks, batcher


def test_a_tenant_filling_the_batch_gives_a_row_to_another_at_the_next_admission(world, monkeypatch):  # noqa: F811
    """globex's request is admitted at the first admission after it arrives, beside 3 of acme's 4
    rows: acme's newest row is set aside, resumed when globex's row leaves, and every acme answer
    is the one it gets alone."""
    make_engine, base, _targets, _store = world
    engine = make_engine(max_batch=4)
    sinks, batcher = _saturated(engine, base, 4)
    admitted = _admissions(batcher, monkeypatch)
    one = SamplingParams(max_new_tokens=3, temperature=0.0)
    # submitted between two steps, on the batcher's thread: the next admission is the one that counts
    globex = batcher.call(lambda: engine.for_tenant("globex").submit(base, Prompt(text="hello there"), one))
    answers = _collect(sinks)
    assert globex.completion().usage.completion_tokens == 3
    assert admitted[0] == (["globex"], 3)  # nobody's row had ended: one was set aside for it
    assert admitted[1] == (["acme+"], 3)  # globex's row left: acme's set-aside row came back
    assert engine.stats()["preemptions"] == 1
    alone_engine = make_engine(max_batch=1)
    params = SamplingParams(max_new_tokens=16, temperature=0.0, logprobs=1, ignore_eos=True)
    alone = [alone_engine.complete(base, Prompt(text=PROMPTS[index % len(PROMPTS)]), params) for index in range(4)]
    _assert_same(answers, alone)
    assert all(answer.usage.completion_tokens == 16 for answer in answers)  # nothing running was killed


def test_without_fairness_another_tenant_waits_for_a_row_to_end(world, monkeypatch):  # noqa: F811
    make_engine, base, _targets, _store = world
    engine = make_engine(max_batch=4, fair=False)
    sinks, batcher = _saturated(engine, base, 4)
    admitted = _admissions(batcher, monkeypatch)
    one = SamplingParams(max_new_tokens=1, temperature=0.0)
    globex = batcher.call(lambda: engine.for_tenant("globex").submit(base, Prompt(text="hello there"), one))
    _collect(sinks)
    globex.completion()
    assert admitted == [(["globex"], 0)]  # only once acme's rows (all 16 tokens long) had ended
    assert engine.stats()["preemptions"] == 0


def test_a_requests_tokens_are_held_until_its_choices_leave_the_batch(world):  # noqa: F811
    """n × max_tokens is reserved at once and given back only when every choice has ended
    (finished, cancelled or failed); ignore_eos cannot run a choice past what was reserved."""
    make_engine, base, _targets, _store = world
    engine = make_engine(max_batch=4)
    acme = engine.for_tenant("acme", tokens_in_flight=40)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True, min_tokens=10)
    release, holder = _held(engine, base)
    with acme.reserve(params.max_new_tokens, 3) as lease:
        sinks = [acme.under(lease).submit(base, Prompt(text=PROMPT), params) for _ in range(3)]
    assert engine.budget.held_tokens("acme") == 30
    with pytest.raises(ApiError) as refused:
        acme.reserve(params.max_new_tokens, 2)  # 30 + 20 > 40
    assert (refused.value.status_code, refused.value.code) == (429, "tokens_in_flight_exceeded")
    assert refused.value.retry_after >= 1
    lone = acme.submit(base, Prompt(text=PROMPT), params)  # a lone submit reserves its own 10
    assert engine.budget.held_tokens("acme") == 40
    with pytest.raises(ApiError) as over:
        acme.reserve(params.max_new_tokens, 5)  # 50 > 40: never
    assert (over.value.status_code, over.value.code) == (400, "max_tokens_over_budget")
    sinks[0].cancel()  # its client went away while it waited
    release.set()
    holder.join(30)
    finished = _collect(sinks[1:] + [lone])
    assert [completion.usage.completion_tokens for completion in finished] == [10, 10, 10]
    assert engine.budget.held_tokens("acme") == 0


def test_a_failed_generation_gives_its_tokens_back(world, monkeypatch):  # noqa: F811
    make_engine, base, _targets, _store = world
    engine = make_engine(max_batch=4)
    acme = engine.for_tenant("acme", tokens_in_flight=100)
    release, holder = _held(engine, base)
    batcher = engine._batcher(engine._model(base))

    def broken(adapters, **inputs):  # noqa: ANN001, ANN202
        raise RuntimeError("out of memory")

    monkeypatch.setattr(batcher, "run_model", broken)
    sink = acme.submit(base, Prompt(text=PROMPT), SamplingParams(max_new_tokens=50, temperature=0.0))
    assert engine.budget.held_tokens("acme") == 50
    release.set()
    holder.join(30)
    with pytest.raises(ApiError):
        sink.completion()
    assert engine.budget.held_tokens("acme") == 0
