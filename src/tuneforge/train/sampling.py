"""Batched sampling from the model being trained: many prompts, one forward pass per new token.

Reinforcement objectives sample their rollouts here (`train/rollout.py` calls
them with the model in eval mode and gradients off). Prompts are left-padded
into one batch and prefilled once; each further token is one forward pass of
the whole batch over its key/value cache. A row that has written an
end-of-sequence token is finished: it keeps taking part (its token is the pad,
never read) until every row is, or `max_new_tokens` are written, so the batch
keeps one shape. Rows are sampled `max_rows` at a time; consecutive rows with the same prompt (a group)
share one prefill.

A LoRA model samples with its adapters folded into a copy of the weights they
adapt (`merged_adapter`): the same function with a third of the matrix products.

Determinism: every draw comes from `generator` — one draw over the whole batch
per token (`draw`), in a fixed order — so the same prompts, weights and
generator state give the same completions.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tuneforge.planning.memory import MERGED_ADAPTER_BYTES

MERGED_COPY_BYTES = MERGED_ADAPTER_BYTES  # the merged weights' copy, at most (planning/memory.py counts it)


@dataclass(frozen=True)
class Completions:
    token_ids: list[list[int]]  # per prompt: the tokens written, its end-of-sequence token included
    stopped: list[bool]  # per prompt: ended by an end-of-sequence token (else by the length limit)


@torch.no_grad()
def sample(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
           eos_ids: Collection[int], pad_id: int, generator: torch.Generator, device: torch.device,
           max_rows: int = 64, json_tokenizer: Any = None) -> Completions:
    """A completion for each prompt (see the module's docstring). `json_tokenizer`: each completion is
    one JSON object (`serve/constrained.py`'s constraint, row by row, drawing from `generator` too);
    a row ends when its object is whole."""
    token_ids: list[list[int]] = []
    stopped: list[bool] = []
    with merged_adapter(model):
        for start in range(0, len(prompts), max_rows):
            part = _sample_rows(model, prompts[start:start + max_rows], max_new_tokens=max_new_tokens,
                                temperature=temperature, eos_ids=eos_ids, pad_id=pad_id, generator=generator,
                                device=device, json_tokenizer=json_tokenizer)
            token_ids += part.token_ids
            stopped += part.stopped
    return Completions(token_ids, stopped)


@contextlib.contextmanager
def merged_adapter(model: torch.nn.Module) -> Iterator[None]:
    """While open, a LoRA model runs with each adapted layer's adapter folded into a copy of its base
    weight (W + scale * B @ A) and the adapters off: the same function, one matrix product per layer
    instead of three, which is most of a small model's sampling time. The base weights are swapped
    back as they were (no arithmetic is done on them), so training and exact resumes see the very
    same tensors. Only where it applies (`_mergeable`): plain float weights of one active LoRA adapter
    without DoRA or bias, on one process's own module (not sharded), the copies within
    `MERGED_COPY_BYTES`; elsewhere the model samples as it is."""
    layers = _mergeable(model)
    if not layers:
        yield
        return
    swapped: list[tuple[Any, torch.nn.Parameter, torch.Tensor]] = []
    try:
        for layer, adapter in layers:
            weight = layer.base_layer.weight
            merged = weight.detach() + layer.get_delta_weight(adapter).to(weight.dtype)
            swapped.append((layer, weight, weight.data))
            weight.data = merged
            layer._disable_adapters = True  # the layer's own switch (PEFT's context also walks the whole model)
        yield
    finally:
        for layer, weight, original in swapped:
            weight.data = original
            layer._disable_adapters = False


def _mergeable(model: torch.nn.Module) -> list[tuple[Any, str]]:
    from tuneforge.train.distributed import unwrap

    inner = unwrap(model)
    if not hasattr(inner, "disable_adapter"):
        return []
    layers: list[tuple[Any, str]] = []
    copied = 0
    for module in inner.modules():
        if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
            continue
        active = list(getattr(module, "active_adapters", ()))
        weight = getattr(module.base_layer, "weight", None)
        plain = type(module.base_layer).__name__ in ("Linear", "Conv1D") and weight is not None \
            and type(weight.data) is torch.Tensor and weight.dtype.is_floating_point
        if len(active) != 1 or not plain or not hasattr(module, "get_delta_weight") or module.disable_adapters \
                or getattr(module, "merged", False) or getattr(module, "use_dora", {}).get(active[0]) \
                or getattr(module, "lora_bias", {}).get(active[0]) or active[0] not in module.lora_A:
            return []
        copied += weight.numel() * weight.element_size()
        layers.append((module, active[0]))
    return layers if copied <= MERGED_COPY_BYTES else []


def _sample_rows(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 temperature: float, eos_ids: Collection[int], pad_id: int, generator: torch.Generator,
                 device: torch.device, json_tokenizer: Any) -> Completions:
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    lengths = torch.zeros(len(prompts), dtype=torch.long, device=device)  # tokens each row wrote
    ended = torch.zeros(len(prompts), dtype=torch.bool, device=device)  # by an end-of-sequence or a whole object
    constraints = None
    if json_tokenizer is not None:
        from tuneforge.serve.constrained import JsonConstraint
        from tuneforge.serve.params import SamplingParams

        constraints = [JsonConstraint(json_tokenizer, frozenset(eos_ids)) for _ in prompts]
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, json_mode=True)
    written: list[torch.Tensor] = []
    # the prompt's logits but the last are never read: a forward that can skip them holds rows x vocab, not
    # rows x prompt x vocab (gigabytes for long prompts and large vocabularies)
    last_only = {"logits_to_keep": 1} if _keeps_logits(model) else {}
    output = _prefill(model, ids, mask, positions, last_only)
    for _ in range(max_new_tokens):
        logits = output.logits[:, -1, :].float()
        if constraints is None:
            drawn = draw(logits, temperature, generator)
            whole = torch.zeros_like(done)
        else:
            drawn, whole = _constrained(constraints, logits, done, params, generator, int(eos[0]))
        drawn = torch.where(done, torch.full_like(drawn, pad_id), drawn)
        written.append(drawn)
        lengths += (~done).long()
        finished = torch.isin(drawn, eos) | whole
        ended |= finished & ~done
        done = done | finished
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype, device=device)], dim=1)
        positions = positions[:, -1:] + 1
        output = model(input_ids=drawn.unsqueeze(1), attention_mask=mask, position_ids=positions,
                       past_key_values=output.past_key_values, use_cache=True)
    return _completions(written, lengths.tolist(), ended.tolist())


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """One token per row from softmax(logits / temperature): the row's argmax of p / E with E drawn
    from Exp(1) per token as -log U, U uniform (the first of independent exponential clocks of rates p
    to ring is token i with probability p_i) — what `torch.multinomial` draws, at a third of its cost
    on a CPU."""
    probabilities = torch.softmax(logits / temperature, dim=-1)
    clocks = torch.rand(probabilities.shape, generator=generator, device=probabilities.device).log_().neg_()
    return torch.argmax(probabilities / clocks, dim=-1)


def _prefill(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
             extra: dict[str, Any]) -> Any:
    """The prompts' forward pass with the cache. Rows repeating the row before them (a group's
    samples of one prompt) are computed once: the distinct runs of rows go through the model and
    their cache and logits are repeated, which divides the prefill's work by the group size."""
    starts = [0] + [row for row in range(1, len(ids)) if not torch.equal(ids[row], ids[row - 1])]
    counts = torch.tensor([end - start for start, end in zip(starts, starts[1:] + [len(ids)])], device=ids.device)
    if len(starts) == len(ids):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
    output = model(input_ids=ids[starts], attention_mask=mask[starts], position_ids=positions[starts],
                   use_cache=True, **extra)
    cache = output.past_key_values
    if not hasattr(cache, "batch_select_indices"):  # a cache that cannot be repeated: every row, then
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
    rows = torch.repeat_interleave(torch.arange(len(starts), device=ids.device), counts)
    cache.batch_select_indices(rows)
    output.logits = output.logits[:, -1:][rows]
    return output


def _constrained(constraints: list[Any], logits: torch.Tensor, done: torch.Tensor, params: Any,
                 generator: torch.Generator, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each unfinished row's next token under its JSON constraint, and whether its object is now whole
    (a row whose object can go no further ends with an end-of-sequence token)."""
    tokens, whole = [], []
    for row, constraint in enumerate(constraints):
        token = None if bool(done[row]) else constraint.pick(logits[row], params, generator)
        tokens.append(eos_id if token is None else token)
        whole.append(constraint.complete)
    return (torch.tensor(tokens, dtype=torch.long, device=logits.device),
            torch.tensor(whole, dtype=torch.bool, device=logits.device))


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (a PEFT model passes it to its base's)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def _completions(written: list[torch.Tensor], lengths: list[int], ended: list[bool]) -> Completions:
    table = torch.stack(written, dim=1).tolist() if written else [[] for _ in lengths]
    return Completions([row[:length] for row, length in zip(table, lengths)], list(ended))
