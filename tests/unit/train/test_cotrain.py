"""The co-training engine: a cycle mixing LoRA models of several ranks and tenants gives each model
what training it alone gives, keeps them apart, and resumes exactly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tuneforge.train.cotrain import (
    AdamParams,
    Datum,
    ForwardBackward,
    LoraShape,
    RequestError,
    SharedBase,
)

# batched matrix products add in another order than one model's alone: gradients agree to this
# relative tolerance (float32 on a CPU; measured ~1e-6)
GRAD_RTOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Path, object]:
    return tiny_model_dir, AutoTokenizer.from_pretrained(tiny_model_dir)


def fresh(tiny: tuple[Path, object]) -> SharedBase:
    model_dir, tokenizer = tiny
    torch.manual_seed(0)
    return SharedBase(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer)


def datum(tokens: list[int], weights: list[float] | None = None) -> Datum:
    inputs = {"target_tokens": torch.tensor(tokens[1:] + [tokens[0]])}
    inputs["weights"] = torch.tensor(weights if weights is not None else [1.0] * len(tokens))
    return Datum(tokens, inputs)


MODELS = {  # name: (rank, seed, what it trains on)
    "tenant-a:m0": (8, 1, [datum([5, 9, 14, 3, 22, 7]), datum([11, 4, 8], [0.0, 1.0, 2.5])]),
    "tenant-b:m0": (32, 2, [datum([40, 41, 42, 43, 44, 45, 46, 47, 48])]),
    "tenant-b:m1": (16, 3, [datum([3, 3, 3, 3], [1.0, -0.5, 1.0, 1.0]), datum([60, 61])]),
}


def host_all(base: SharedBase, names: list[str]) -> None:
    for name in names:
        rank, seed, _data = MODELS[name]
        base.host(name, LoraShape(rank=rank, seed=seed))


def grads(base: SharedBase, name: str) -> list[torch.Tensor]:
    return [param.grad.clone() for param in base.adapters[name].parameters()]


def test_a_cycle_mixing_ranks_and_tenants_gives_each_model_its_alone_gradients(tiny) -> None:
    names = list(MODELS)
    together = fresh(tiny)
    host_all(together, names)
    results = together.forward_backward([ForwardBackward(name, MODELS[name][2]) for name in names])
    for name, result in zip(names, results):
        alone = fresh(tiny)
        host_all(alone, [name])
        (own,) = alone.forward_backward([ForwardBackward(name, MODELS[name][2])])
        assert not isinstance(result, RequestError) and not isinstance(own, RequestError)
        assert result.metrics["loss:sum"] == pytest.approx(own.metrics["loss:sum"], rel=1e-5)
        for mixed, single in zip(result.logprobs, own.logprobs):
            assert torch.allclose(mixed, single, rtol=1e-5, atol=1e-6)
        shared, solo = grads(together, name), grads(alone, name)
        assert len(shared) == len(solo) > 0
        for mixed_grad, solo_grad in zip(shared, solo):
            scale = float(solo_grad.abs().max())
            assert float((mixed_grad - solo_grad).abs().max()) <= GRAD_RTOL * max(scale, 1e-8)
        # a B starts at zero, so the first gradient lives in B; it is not zero
        assert any(float(g.abs().max()) > 0 for g in solo)


def test_the_cross_entropy_loss_is_the_weighted_sum_of_target_logprobs(tiny) -> None:
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0"])
    data = MODELS["tenant-a:m0"][2]
    (result,) = base.forward_backward([ForwardBackward("tenant-a:m0", data, forward_only=True)])
    assert not isinstance(result, RequestError)
    expected = -sum(float((lp * d.inputs["weights"]).sum()) for lp, d in zip(result.logprobs, data))
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    assert [tuple(lp.shape) for lp in result.logprobs] == [(6,), (3,)]
    assert all(float(lp.max()) < 0 for lp in result.logprobs)
    # forward_only leaves no gradient
    assert all(param.grad is None for param in base.adapters["tenant-a:m0"].parameters())


def test_a_step_of_one_model_changes_neither_the_others_weights_nor_their_logits(tiny) -> None:
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0", "tenant-b:m0"])
    probe = [datum([7, 8, 9, 10])]
    before = base.forward_backward([ForwardBackward("tenant-b:m0", probe, forward_only=True)])[0].logprobs[0]
    other = [param.detach().clone() for param in base.adapters["tenant-b:m0"].parameters()]
    for _ in range(3):
        base.forward_backward([ForwardBackward("tenant-a:m0", MODELS["tenant-a:m0"][2])])
        base.optim_step("tenant-a:m0", AdamParams(learning_rate=1e-2))
    after = base.forward_backward([ForwardBackward("tenant-b:m0", probe, forward_only=True)])[0].logprobs[0]
    assert torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(other, base.adapters["tenant-b:m0"].parameters()))
    moved = base.forward_backward([ForwardBackward("tenant-a:m0", probe, forward_only=True)])[0].logprobs[0]
    assert not torch.allclose(moved, before)


def test_training_lowers_the_loss_and_a_saved_state_resumes_bit_for_bit(tiny) -> None:
    data = MODELS["tenant-b:m0"][2]
    adam = AdamParams(learning_rate=5e-3, weight_decay=0.01, grad_clip_norm=1.0)

    def step(base: SharedBase, name: str) -> float:
        (result,) = base.forward_backward([ForwardBackward(name, data)])
        base.optim_step(name, adam)
        assert not isinstance(result, RequestError)
        return result.metrics["loss:sum"]

    base = fresh(tiny)
    host_all(base, ["tenant-b:m0"])
    losses = [step(base, "tenant-b:m0") for _ in range(6)]
    assert losses[-1] < losses[0] * 0.8
    state = base.adapters["tenant-b:m0"].state_bytes()
    uninterrupted = [step(base, "tenant-b:m0") for _ in range(3)]

    other = fresh(tiny)
    other.load_state("resumed", state, with_optimizer=True)
    assert [step(other, "resumed") for _ in range(3)] == uninterrupted
    # without the optimizer state the same weights take different steps
    other.load_state("weights-only", state, with_optimizer=False)
    assert [step(other, "weights-only") for _ in range(3)] != uninterrupted


def test_a_wrong_request_fails_alone_and_the_rest_of_its_cycle_runs(tiny) -> None:
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0", "tenant-b:m0"])
    vocab = base.vocab_size
    bad = [
        ForwardBackward("tenant-a:m0", [datum([1, 2, vocab])]),
        ForwardBackward("tenant-a:m0", [Datum([1, 2], {"target_tokens": torch.tensor([1, 2, 3])})]),
        ForwardBackward("tenant-a:m0", [Datum([1, 2], {"target_tokens": torch.tensor([1, 2])})], "ppo"),
        ForwardBackward("tenant-a:m0", [datum([1, 2])], "dro"),
        ForwardBackward("nobody", [datum([1, 2])]),
        ForwardBackward("tenant-a:m0", [datum([1, 2], [math.nan, 1.0])]),
    ]
    good = ForwardBackward("tenant-b:m0", MODELS["tenant-b:m0"][2])
    results = base.forward_backward([*bad, good])
    messages = [str(result) for result in results[:-1]]
    assert all(isinstance(result, RequestError) and result.category == "user" for result in results[:-1])
    assert "data[0].model_input has a token outside the vocabulary" in messages[0]
    assert "target_tokens must have shape (2,)" in messages[1]
    assert "loss_fn_inputs.logprobs is required by ppo" in messages[2]
    assert "'dro'" in messages[3] and "importance_sampling" in messages[3]
    assert "not hosted" in messages[4]
    assert "weights has a value that is not finite" in messages[5]
    assert not isinstance(results[-1], RequestError)
    assert all(param.grad is None for param in base.adapters["tenant-a:m0"].parameters())


def test_importance_sampling_and_ppo_at_the_samplers_own_logprobs_are_minus_the_advantages(tiny) -> None:
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0"])
    tokens = [5, 9, 14, 3]
    targets = torch.tensor([9, 14, 3, 5])
    (probe,) = base.forward_backward([ForwardBackward("tenant-a:m0", [Datum(tokens, {"target_tokens": targets})],
                                                      forward_only=True)])
    assert not isinstance(probe, RequestError)
    advantages = torch.tensor([1.0, -2.0, 0.5, 3.0])
    for loss_fn in ("importance_sampling", "ppo"):
        inputs = {"target_tokens": targets, "logprobs": probe.logprobs[0], "advantages": advantages}
        (result,) = base.forward_backward([ForwardBackward("tenant-a:m0", [Datum(tokens, inputs)], loss_fn)])
        assert not isinstance(result, RequestError)
        assert result.metrics["loss:sum"] == pytest.approx(-float(advantages.sum()), abs=1e-4)


def test_sampling_is_seeded_reports_the_models_logprobs_and_stops_where_asked(tiny) -> None:
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0"])
    prompt = [5, 9, 14, 3]
    first = base.sample("tenant-a:m0", prompt, num_samples=3, max_tokens=6, seed=7, stop=[], prompt_logprobs=True)
    again = base.sample("tenant-a:m0", prompt, num_samples=3, max_tokens=6, seed=7, stop=[])
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert all(len(s.tokens) == 6 and not s.stopped for s in first.sequences)
    assert first.prompt_logprobs is not None and math.isnan(first.prompt_logprobs[0])
    assert len(first.prompt_logprobs) == len(prompt)
    # a sampled token's logprob is what forward gives for it
    sequence = first.sequences[0]
    tokens = prompt + sequence.tokens
    targets = torch.tensor(tokens[1:] + [0])
    (scored,) = base.forward_backward([ForwardBackward("tenant-a:m0", [Datum(tokens, {"target_tokens": targets})],
                                                       forward_only=True)])
    assert not isinstance(scored, RequestError)
    own = scored.logprobs[0][len(prompt) - 1:len(tokens) - 1]
    assert torch.allclose(own, torch.tensor(sequence.logprobs), atol=1e-4)
    assert torch.allclose(scored.logprobs[0][:len(prompt) - 1], torch.tensor(first.prompt_logprobs[1:]), atol=1e-4)
    # a stop token ends the row with the token kept
    free = base.sample("tenant-a:m0", prompt, num_samples=1, max_tokens=6, seed=7, stop=[]).sequences[0]
    stop_token = free.tokens[2]
    stopped = base.sample("tenant-a:m0", prompt, num_samples=1, max_tokens=6, seed=7, stop=[stop_token])
    assert stopped.sequences[0].stopped and stopped.sequences[0].tokens[-1] == stop_token
    assert stopped.sequences[0].tokens == free.tokens[:free.tokens.index(stop_token) + 1]


def test_a_state_kept_between_forward_backward_and_optim_step_keeps_the_gradients(tiny) -> None:
    data = MODELS["tenant-a:m0"][2]
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0"])
    base.forward_backward([ForwardBackward("tenant-a:m0", data)])
    kept = base.adapters["tenant-a:m0"].state_bytes(with_gradients=True)
    base.optim_step("tenant-a:m0", AdamParams(learning_rate=1e-2))
    stepped = [param.detach().clone() for param in base.adapters["tenant-a:m0"].parameters()]

    other = fresh(tiny)
    other.load_state("again", kept, with_optimizer=True)
    other.optim_step("again", AdamParams(learning_rate=1e-2))
    assert all(torch.equal(a, b) for a, b in zip(stepped, other.adapters["again"].parameters()))
    # without the gradients the step would have done nothing to B (zero at the start)
    assert any(float(p.abs().max()) > 0 for p in stepped[1::2])


def test_requests_larger_than_one_pass_run_in_parts_with_the_same_gradients(tiny) -> None:
    names = list(MODELS)
    whole = fresh(tiny)
    host_all(whole, names)
    whole.forward_backward([ForwardBackward(name, MODELS[name][2]) for name in names])
    parts = fresh(tiny)
    parts.max_pass_tokens = 12  # every pass one or two rows: five passes instead of one
    host_all(parts, names)
    results = parts.forward_backward([ForwardBackward(name, MODELS[name][2]) for name in names])
    assert all(not isinstance(result, RequestError) for result in results)
    for name in names:
        for one, split in zip(grads(whole, name), grads(parts, name)):
            assert float((one - split).abs().max()) <= GRAD_RTOL * max(float(one.abs().max()), 1e-8)


def test_a_datum_longer_than_the_bases_context_is_refused(tiny) -> None:
    base = fresh(tiny)
    host_all(base, ["tenant-a:m0"])
    assert base.context is not None
    (result,) = base.forward_backward([ForwardBackward("tenant-a:m0", [datum([1] * (base.context + 1))])])
    assert isinstance(result, RequestError) and "more than the base's context" in result.message
    with pytest.raises(RequestError, match="exceed the base's context"):
        base.sample("tenant-a:m0", [1, 2], num_samples=1, max_tokens=base.context)


def test_sample_requests_of_several_models_share_one_batch_and_each_gets_what_it_gets_alone(tiny) -> None:
    from tuneforge.train.cotrain import SampleRequest

    names = ["tenant-a:m0", "tenant-b:m0"]
    base = fresh(tiny)
    host_all(base, names)
    for name in names:  # give the adapters weights of their own, so that they sample differently
        for _ in range(3):
            base.forward_backward([ForwardBackward(name, MODELS[name][2])])
            base.optim_step(name, AdamParams(learning_rate=5e-2))
    requests = [
        SampleRequest("tenant-a:m0", [5, 9, 14, 3, 22, 7], 2, 5, seed=1, stop=[], prompt_logprobs=True),
        SampleRequest("tenant-b:m0", [40, 41], 3, 7, temperature=0.7, top_k=20, seed=2, stop=[]),
        SampleRequest(None, [11, 4, 8, 60], 1, 3, top_p=0.9, seed=3, stop=[]),
        SampleRequest("nobody", [1, 2], 1, 3),
    ]
    together = base.sample_many(requests)
    assert isinstance(together[-1], RequestError) and "not hosted" in together[-1].message
    for request, shared in zip(requests[:-1], together[:-1]):
        (alone,) = base.sample_many([request])
        assert not isinstance(shared, RequestError) and not isinstance(alone, RequestError)
        assert [s.tokens for s in shared.sequences] == [s.tokens for s in alone.sequences]
        assert [len(s.tokens) for s in shared.sequences] == [request.max_tokens] * request.num_samples
        for one, other in zip(shared.sequences, alone.sequences):
            assert torch.allclose(torch.tensor(one.logprobs), torch.tensor(other.logprobs), atol=1e-4)
    first = together[0]
    assert not isinstance(first, RequestError) and first.prompt_logprobs is not None
    assert len(first.prompt_logprobs) == 6 and math.isnan(first.prompt_logprobs[0])
    # the models differ: the same prompt and seed sample differently through each adapter
    probe = [SampleRequest(name, [5, 9, 14], 4, 6, seed=5, stop=[]) for name in names]
    a, b = base.sample_many(probe)
    assert not isinstance(a, RequestError) and not isinstance(b, RequestError)
    assert [s.logprobs for s in a.sequences] != [s.logprobs for s in b.sequences]


def test_the_dense_and_the_split_adapter_products_give_the_same_gradients(tiny, monkeypatch) -> None:
    from tuneforge.train import cotrain

    names = list(MODELS)
    found = []
    for limit in (cotrain.DENSE_RANKS, 0):  # 0: every pass takes the run-by-run product
        monkeypatch.setattr(cotrain, "DENSE_RANKS", limit)
        base = fresh(tiny)
        host_all(base, names)
        base.forward_backward([ForwardBackward(name, MODELS[name][2]) for name in names])
        found.append({name: grads(base, name) for name in names})
    dense, split = found
    for name in names:
        for one, other in zip(dense[name], split[name]):
            assert float((one - other).abs().max()) <= GRAD_RTOL * max(float(one.abs().max()), 1e-8)
