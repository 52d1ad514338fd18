"""A tiny base model that already behaves: it answers the platform's golden set
and refuses the platform's harmful prompts, so eval gates have something to
protect. Built by fully training the demo's random Llama on those two sets
(and keeping it in float32 on disk), once per test session."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tuneforge.data.tokenize import tokenize_example
from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.eval import shipped
from tuneforge.train.batches import collate, score_tokens


def aligned_rows() -> list[dict]:
    return [{"messages": row["messages"]} for row in shipped.golden_examples() + shipped.safety_examples()]


def build_aligned_model(out_dir: Path, *, steps: int = 200, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    raw = build_tiny_model(out_dir.parent / f"{out_dir.name}-random", seed=seed, hidden_size=96,
                           intermediate_size=256, num_hidden_layers=2)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(raw)
    model = AutoModelForCausalLM.from_pretrained(raw, dtype=torch.float32)
    examples = [tokenize_example(row, tokenizer, max_seq_length=128) for row in aligned_rows()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3)
    rng = random.Random(seed)
    model.train()
    for _step in range(steps):
        batch = collate(rng.sample(examples, 16), tokenizer.pad_token_id, torch.device("cpu"))
        scores = score_tokens(model, batch)
        (scores.loss_sum / max(1, scores.count)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
