"""Batched sampling from the model being trained: many prompts, one forward pass per new token.

Reinforcement objectives sample their rollouts here (`train/rollout.py` calls
them with the model in eval mode and gradients off). Prompts are left-padded
into one batch and prefilled once; each further token is one forward pass of
the whole batch over its key/value cache. A row that has written an
end-of-sequence token is finished: it keeps taking part (its token is the pad,
never read) until every row is, or `max_new_tokens` are written, so the batch
keeps one shape. Rows are sampled `max_rows` at a time.

Determinism: every draw comes from `generator` — one `torch.multinomial` over
the whole batch per token, in a fixed order — so the same prompts, weights and
generator state give the same completions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Completions:
    token_ids: list[list[int]]  # per prompt: the tokens written, its end-of-sequence token included
    stopped: list[bool]  # per prompt: ended by an end-of-sequence token (else by the length limit)


@torch.no_grad()
def sample(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
           eos_ids: Collection[int], pad_id: int, generator: torch.Generator, device: torch.device,
           max_rows: int = 64) -> Completions:
    """A completion for each prompt (see the module's docstring)."""
    token_ids: list[list[int]] = []
    stopped: list[bool] = []
    for start in range(0, len(prompts), max_rows):
        part = _sample_rows(model, prompts[start:start + max_rows], max_new_tokens=max_new_tokens,
                            temperature=temperature, eos_ids=eos_ids, pad_id=pad_id, generator=generator,
                            device=device)
        token_ids += part.token_ids
        stopped += part.stopped
    return Completions(token_ids, stopped)


def _sample_rows(model: torch.nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 temperature: float, eos_ids: Collection[int], pad_id: int, generator: torch.Generator,
                 device: torch.device) -> Completions:
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
    written: list[torch.Tensor] = []
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    for _ in range(max_new_tokens):
        logits = output.logits[:, -1, :].float()
        probabilities = torch.softmax(logits / temperature, dim=-1)
        drawn = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)
        drawn = torch.where(done, torch.full_like(drawn, pad_id), drawn)
        written.append(drawn)
        done = done | torch.isin(drawn, eos)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype, device=device)], dim=1)
        positions = positions[:, -1:] + 1
        output = model(input_ids=drawn.unsqueeze(1), attention_mask=mask, position_ids=positions,
                       past_key_values=output.past_key_values, use_cache=True)
    return _completions(written, len(prompts), set(int(token) for token in eos.tolist()))


def _completions(written: list[torch.Tensor], rows: int, eos_ids: set[int]) -> Completions:
    table = torch.stack(written, dim=1).tolist() if written else [[] for _ in range(rows)]
    token_ids, stopped = [], []
    for row in table:
        end = next((index for index, token in enumerate(row) if token in eos_ids), None)
        token_ids.append(row if end is None else row[:end + 1])
        stopped.append(end is not None)
    return Completions(token_ids, stopped)
