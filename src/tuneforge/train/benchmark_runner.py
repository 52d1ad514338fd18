"""Score benchmark tasks (`eval/benchmarks.py`) on one loaded model, batched.

Multiple choice: the log-likelihood of each choice's continuation after its
context, many (context, continuation) pairs per forward pass (right padded). When
every continuation of a question is one token (" A", " B", ...) the question costs
one sequence: the context alone, each choice read off the logits at its last
position. Generation: greedy decoding of many prompts at once, left padded, cut at
the task's stop strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tuneforge.eval import benchmarks

DEFAULT_BATCH_SIZE = 16
MAX_CONTEXT_TOKENS = 2048  # a longer context keeps its last tokens (lm-eval truncates from the left too)


@dataclass(frozen=True)
class _Pair:
    """One sequence to score: which (request, choice) it answers, its tokens and how many end it."""

    request: int
    choices: tuple[int, ...]
    """The choices it scores: one (its continuation is in `tokens`), or all of a single-token question."""
    tokens: tuple[int, ...]
    continuation: int
    """How many of the last tokens are scored (0: the choices' single tokens follow the last position)."""
    choice_tokens: tuple[int, ...] = ()


def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _split_space(context: str, continuation: str) -> tuple[str, str]:
    """Trailing spaces of the context belong to the continuation (as lm-eval encodes them)."""
    stripped = context.rstrip(" ")
    return stripped, context[len(stripped):] + continuation


def _pairs(task: benchmarks.BenchmarkTask, tokenizer: Any, max_tokens: int) -> list[_Pair]:
    pairs = []
    for index, request in enumerate(task.requests):
        encoded = []
        for choice in request.choices:
            context, continuation = _split_space(request.context, choice)
            context_ids = _encode(tokenizer, context, True)
            encoded.append((context_ids, _encode(tokenizer, continuation, False)))
        shared = all(c == encoded[0][0] for c, _ in encoded) and all(len(ids) == 1 for _, ids in encoded)
        if shared:
            context_ids = encoded[0][0][-max_tokens:]
            pairs.append(_Pair(index, tuple(range(len(encoded))), tuple(context_ids), 0,
                               tuple(ids[0] for _, ids in encoded)))
            continue
        for number, (context_ids, continuation_ids) in enumerate(encoded):
            whole = (context_ids + continuation_ids)[-max_tokens:]
            pairs.append(_Pair(index, (number,), tuple(whole), min(len(continuation_ids), len(whole) - 1)))
    return pairs


@torch.no_grad()
def _score_batch(model: Any, batch: list[_Pair], pad: int, device: torch.device) -> list[list[float]]:
    """Each pair's log-likelihood of what it scores, from one forward pass."""
    width = max(len(p.tokens) for p in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, pair in enumerate(batch):
        ids[row, : len(pair.tokens)] = torch.tensor(pair.tokens)
        mask[row, : len(pair.tokens)] = 1
    # kept in the model's dtype: only the scored positions are widened (a 7B's batch of full
    # float32 logits would be gigabytes)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    out = []
    for row, pair in enumerate(batch):
        length = len(pair.tokens)
        if pair.continuation == 0:
            logprobs = torch.log_softmax(logits[row, length - 1].float(), dim=-1)
            out.append([float(logprobs[token]) for token in pair.choice_tokens])
            continue
        positions = slice(length - pair.continuation - 1, length - 1)
        logprobs = torch.log_softmax(logits[row, positions].float(), dim=-1)
        targets = torch.tensor(pair.tokens[length - pair.continuation:], device=logprobs.device)
        out.append([float(logprobs.gather(1, targets[:, None]).sum())])
    return out


def loglikelihoods(model: Any, tokenizer: Any, device: torch.device, task: benchmarks.BenchmarkTask, *,
                   batch_size: int = DEFAULT_BATCH_SIZE, max_tokens: int = MAX_CONTEXT_TOKENS) -> list[list[float]]:
    """Per request, the log-likelihood of each choice; `batch_size` sequences per forward pass
    (longest first, so a batch holds sequences of similar length)."""
    pairs = _pairs(task, tokenizer, max_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scores: list[list[float]] = [[0.0] * len(r.choices) for r in task.requests]
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i].tokens))
    for start in range(0, len(order), max(1, batch_size)):
        batch = [pairs[i] for i in order[start:start + batch_size]]
        for pair, values in zip(batch, _score_batch(model, batch, pad, device)):
            for choice, value in zip(pair.choices, values):
                scores[pair.request][choice] = value
    return scores


@torch.no_grad()
def generations(model: Any, tokenizer: Any, device: torch.device, task: benchmarks.BenchmarkTask, *,
                batch_size: int = DEFAULT_BATCH_SIZE, max_tokens: int = MAX_CONTEXT_TOKENS) -> list[str]:
    """Greedy continuations of every context, `batch_size` prompts at once (left padded)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [_encode(tokenizer, r.context, True)[-max_tokens:] for r in task.requests]
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out = [""] * len(prompts)
    for start in range(0, len(order), max(1, batch_size)):
        rows = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, index in enumerate(rows):
            ids[row, width - len(prompts[index]):] = torch.tensor(prompts[index])
            mask[row, width - len(prompts[index]):] = 1
        output = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                max_new_tokens=task.max_gen_toks, do_sample=False, pad_token_id=pad,
                                eos_token_id=tokenizer.eos_token_id,
                                **({"stop_strings": list(task.until), "tokenizer": tokenizer} if task.until else {}))
        for row, index in enumerate(rows):
            text = tokenizer.decode(output[row, width:], skip_special_tokens=True)
            out[index] = benchmarks.cut_at_stops(text, task.until)
    return out


def run_task(model: Any, tokenizer: Any, device: torch.device, task: benchmarks.BenchmarkTask, *,
             batch_size: int = DEFAULT_BATCH_SIZE) -> dict[str, float]:
    """The task's result keys (`benchmark:<task>`, `benchmark:<task>.<metric>`) in points."""
    was_training = model.training
    model.eval()
    try:
        if task.output_type == "multiple_choice":
            points = benchmarks.choice_scores(task, loglikelihoods(model, tokenizer, device, task,
                                                                   batch_size=batch_size))
        else:
            points = benchmarks.generation_scores(task, generations(model, tokenizer, device, task,
                                                                    batch_size=batch_size))
    finally:
        model.train(was_training)
    return benchmarks.result_keys(task, points)
