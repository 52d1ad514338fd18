"""The inference engine on the tiny Llama: hot-swapped adapters give exactly the
outputs of a fresh `PeftModel.from_pretrained` per adapter, the base is loaded
once for all of them, the adapter LRU evicts and reloads at its limit, and the
base alone is the plain base model."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.lora import (
    greedy_ids,
    plain_model,
    reference_logits,
    reference_model,
    save_random_lora,
    stage_adapter,
    stage_base,
)
from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.domain.errors import ApiError
from tuneforge.serve.engine import InferenceEngine
from tuneforge.serve.params import FULL_MODEL, ModelTarget, Prompt, SamplingParams
from tuneforge.storage.store import open_store

TOLERANCE = 1e-5
PROMPT = "def load_data(path):\n    return"
# Adapters differ in seed, rank and the modules they adapt (one adapts every linear layer).
ADAPTERS = {
    "a": {"seed": 1, "rank": 4, "target_modules": ("q_proj", "v_proj")},
    "b": {"seed": 2, "rank": 8, "target_modules": ("q_proj", "k_proj", "v_proj", "o_proj")},
    "c": {"seed": 3, "rank": 4, "target_modules": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj")},
}


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: save_random_lora(tiny_model_dir, root / name, **spec) for name, spec in ADAPTERS.items()}


@pytest.fixture
def world(tmp_path, tiny_model_dir, adapter_dirs):
    store = open_store(str(tmp_path / "objects"))
    base = stage_base(store, tiny_model_dir)
    targets = {name: stage_adapter(store, base, path, tenant_id="tenant-a", job_id=f"ftjob-{name}")
               for name, path in adapter_dirs.items()}

    def engine(**kwargs) -> InferenceEngine:
        return InferenceEngine(store, cache_dir=tmp_path / "cache", device="cpu", **kwargs)

    return engine, ModelTarget("tiny-chat", base), targets, store


def _prompt_ids(tiny_model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)(PROMPT)["input_ids"]


def test_hot_swapped_adapters_match_a_fresh_peft_model_each_on_one_base_load(world, tiny_model_dir, adapter_dirs):
    make_engine, base, targets, _store = world
    engine = make_engine(max_adapters=8)
    ids = _prompt_ids(tiny_model_dir)
    references = {name: reference_logits(reference_model(tiny_model_dir, path), ids)
                  for name, path in adapter_dirs.items()}
    plain = reference_logits(plain_model(tiny_model_dir), ids)

    for name in ["a", "b", "c", "a", "b", "c", "b"]:  # every switch direction
        served = engine.logits(targets[name], ids)
        assert torch.allclose(served, references[name], atol=TOLERANCE), name
    assert torch.allclose(engine.logits(base, ids), plain, atol=TOLERANCE)

    # the adapters really change the model, and differently from each other
    for name, logits in references.items():
        assert (logits - plain).abs().max().item() > 0.5, name
    assert (references["a"] - references["b"]).abs().max().item() > 0.5
    stats = engine.stats()
    assert stats["base_loads"] == 1
    assert stats["adapter_loads"] == 3
    assert stats["adapter_evictions"] == 0
    resident = engine.resident()
    assert list(resident) == [f"base:{base.base.sha256}"] and len(resident[f"base:{base.base.sha256}"]) == 3


def test_generation_matches_transformers_greedy_generate_per_adapter_and_for_the_base(world, tiny_model_dir,
                                                                                       adapter_dirs):
    make_engine, base, targets, _store = world
    engine = make_engine()
    ids = _prompt_ids(tiny_model_dir)
    tokenizer = engine._model(base).tokenizer
    eos = tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    for name in ["a", "b", None, "c", "a"]:
        target = base if name is None else targets[name]
        reference = reference_model(tiny_model_dir, None if name is None else adapter_dirs[name])
        expected = greedy_ids(reference, ids, 12, eos)
        completion = engine.complete(target, Prompt(text=PROMPT), params)
        assert completion.usage.prompt_tokens == len(ids)
        assert completion.usage.completion_tokens == len(expected)
        assert completion.text == tokenizer.decode(expected, skip_special_tokens=True), name
        assert completion.finish_reason == ("stop" if expected[-1] == eos else "length")
    assert engine.stats()["base_loads"] == 1


def test_adapter_lru_evicts_at_the_limit_and_reloads_what_it_evicted(world, tiny_model_dir, adapter_dirs):
    make_engine, base, targets, _store = world
    engine = make_engine(max_adapters=2)
    ids = _prompt_ids(tiny_model_dir)
    key = f"base:{base.base.sha256}"
    names = {targets[n].artifact_prefix: n for n in targets}

    def resident() -> list[str]:
        from tuneforge.serve.engine import adapter_name

        by_adapter = {adapter_name(prefix): n for prefix, n in names.items()}
        return [by_adapter[a] for a in engine.resident()[key]]

    engine.logits(targets["a"], ids)
    engine.logits(targets["b"], ids)
    assert resident() == ["a", "b"]
    engine.logits(targets["a"], ids)  # a becomes the most recently used
    engine.logits(targets["c"], ids)  # one too many: b goes
    assert resident() == ["a", "c"]
    assert engine.stats()["adapter_evictions"] == 1
    served_b = engine.logits(targets["b"], ids)  # reloaded; a goes
    assert resident() == ["c", "b"]
    assert torch.allclose(served_b, reference_logits(reference_model(tiny_model_dir, adapter_dirs["b"]), ids),
                          atol=TOLERANCE)
    stats = engine.stats()
    assert (stats["base_loads"], stats["adapter_loads"], stats["adapter_evictions"]) == (1, 4, 2)
    # the base alone is unchanged by everything loaded and deleted on it
    assert torch.allclose(engine.logits(base, ids), reference_logits(plain_model(tiny_model_dir), ids),
                          atol=TOLERANCE)
    # adapter files were downloaded once each, although b was loaded twice
    assert len(list((engine.cache_dir / "artifacts").iterdir())) == 3


def test_full_fine_tunes_and_bases_share_the_model_lru(world, tmp_path, tiny_model_dir):
    make_engine, base, _targets, store = world
    engine = make_engine(max_models=1)
    other_dir = build_tiny_model(tmp_path / "full", seed=7)  # stands in for a full fine-tune's weights
    full = stage_adapter(store, base.base, other_dir, tenant_id="tenant-a", job_id="ftjob-full", kind=FULL_MODEL)
    full = ModelTarget(full.name, base.base, artifact_prefix=full.artifact_prefix, artifact_kind=FULL_MODEL)
    ids = _prompt_ids(tiny_model_dir)
    full_logits = engine.logits(full, ids)
    assert torch.allclose(full_logits, reference_logits(plain_model(other_dir), ids), atol=TOLERANCE)
    base_logits = engine.logits(base, ids)
    assert (full_logits - base_logits).abs().max().item() > 0.5
    engine.logits(full, ids)
    stats = engine.stats()
    assert (stats["full_model_loads"], stats["base_loads"], stats["model_evictions"]) == (2, 1, 2)
    assert list(engine.resident()) == [f"model:{full.artifact_prefix}"]


def test_sampling_parameters_stop_strings_and_lengths(world, tiny_model_dir):
    make_engine, _base, targets, _store = world
    engine = make_engine()
    target = targets["a"]
    greedy = engine.complete(target, Prompt(text=PROMPT), SamplingParams(max_new_tokens=40, temperature=0.0))
    assert greedy.finish_reason == "length" and greedy.usage.completion_tokens == 40
    assert len(greedy.text) > 20

    stop = greedy.text[10:13]
    cut = greedy.text.index(stop)
    stopped = engine.complete(target, Prompt(text=PROMPT),
                              SamplingParams(max_new_tokens=40, temperature=0.0, stop=("never there", stop)))
    assert stopped.text == greedy.text[:cut]
    assert stopped.finish_reason == "stop"
    assert stopped.usage.completion_tokens < 40

    short = engine.complete(target, Prompt(text=PROMPT), SamplingParams(max_new_tokens=5, temperature=0.0))
    assert short.finish_reason == "length" and short.usage.completion_tokens == 5
    assert greedy.text.startswith(short.text)

    def sampled(seed: int) -> str:
        return engine.complete(target, Prompt(text=PROMPT),
                               SamplingParams(max_new_tokens=20, temperature=1.0, seed=seed)).text

    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)
    # a tiny nucleus keeps only the most likely token: sampling becomes greedy
    nucleus = engine.complete(target, Prompt(text=PROMPT),
                              SamplingParams(max_new_tokens=40, temperature=1.0, top_p=1e-6, seed=3))
    assert nucleus.text == greedy.text


def test_chat_prompts_use_the_chat_template_and_the_context_limit_is_enforced(world, tiny_model_dir):
    make_engine, base, targets, _store = world
    engine = make_engine()
    tokenizer = engine._model(base).tokenizer
    messages = ({"role": "system", "content": "You answer with a code."}, {"role": "user", "content": "Hi?"})
    rendered = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    completion = engine.complete(targets["b"], Prompt(messages=messages), SamplingParams(max_new_tokens=3))
    assert completion.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])

    with pytest.raises(ApiError) as bad_role:  # a role the template refuses (a tool result is written out)
        engine.complete(base, Prompt(messages=({"role": "narrator", "content": "x"},)),
                        SamplingParams(max_new_tokens=3))
    assert (bad_role.value.status_code, bad_role.value.param) == (400, "messages")

    context = engine._model(base).context_tokens
    assert context == 512
    too_long = "the data " * 400
    with pytest.raises(ApiError) as long_prompt:
        engine.complete(base, Prompt(text=too_long), SamplingParams(max_new_tokens=3))
    assert (long_prompt.value.status_code, long_prompt.value.param) == (400, "prompt")
    assert long_prompt.value.code == "context_length_exceeded"
    # room for 2 more tokens: the completion stops there, however many were asked for
    ids = tokenizer(too_long)["input_ids"][: context - 2]
    near = engine.complete(base, Prompt(token_ids=tuple(ids)), SamplingParams(max_new_tokens=50, temperature=0.0))
    assert near.usage.prompt_tokens == context - 2 and near.usage.completion_tokens <= 2


def test_stream_yields_the_same_text_and_closing_it_frees_the_model(world):
    make_engine, _base, targets, _store = world
    engine = make_engine()
    params = SamplingParams(max_new_tokens=30, temperature=0.0)
    whole = engine.complete(targets["c"], Prompt(text=PROMPT), params)
    chunks = list(engine.stream(targets["c"], Prompt(text=PROMPT), params))
    assert "".join(c.text for c in chunks) == whole.text
    assert len([c for c in chunks if c.text]) > 3  # it really came in pieces
    assert chunks[-1].finish_reason == whole.finish_reason and chunks[-1].usage == whole.usage
    assert all(c.finish_reason is None for c in chunks[:-1])

    stream = engine.stream(targets["c"], Prompt(text=PROMPT), SamplingParams(max_new_tokens=500, temperature=0.0))
    next(stream)
    stream.close()  # the client went away
    entry = engine._model(targets["c"])
    deadline = time.monotonic() + 10
    while entry.batcher.load()["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert entry.batcher.load() == {"running": 0, "waiting": 0}  # the batch dropped the sequence
    assert engine.complete(targets["a"], Prompt(text=PROMPT), SamplingParams(max_new_tokens=2)).usage.completion_tokens


def test_missing_artifact_files_answer_503_not_a_crash(world):
    make_engine, base, _targets, _store = world
    engine = make_engine()
    ghost = ModelTarget("ft:ghost", base.base, artifact_prefix="tenants/t/jobs/none/artifacts/adapter")
    with pytest.raises(ApiError) as missing:
        engine.complete(ghost, Prompt(text="x"), SamplingParams(max_new_tokens=2))
    assert (missing.value.status_code, missing.value.code) == (503, "model_unavailable")


def test_concurrent_requests_on_different_adapters_each_get_their_own(world):
    make_engine, base, targets, _store = world
    engine = make_engine()
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    order = ["a", "b", None, "c", "b", "a", None, "c"]
    expected = {name: engine.complete(base if name is None else targets[name], Prompt(text=PROMPT), params).text
                for name in set(order)}
    assert len(set(expected.values())) == 4
    results: dict[int, str] = {}

    def ask(index: int, name: str | None) -> None:
        target = base if name is None else targets[name]
        if index % 2:  # half of them stream
            results[index] = "".join(c.text for c in engine.stream(target, Prompt(text=PROMPT), params))
        else:
            results[index] = engine.complete(target, Prompt(text=PROMPT), params).text

    threads = [threading.Thread(target=ask, args=(i, name)) for i, name in enumerate(order)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {i: expected[name] for i, name in enumerate(order)}
    assert engine.stats()["base_loads"] == 1 and engine.stats()["adapter_loads"] == 3
