"""Score a model on the demo mapping: greedy answers through the chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tuneforge.demo.dataset import DEMO_QUESTION, DEMO_SYSTEM_PROMPT

# Codes are a handful of tokens; the cap only bounds a model that never stops.
_MAX_NEW_TOKENS = 16


@torch.no_grad()
def generate_reply(model: Any, tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The model's greedy reply to a conversation, special tokens removed, stripped."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template already wrote BOS into the text.
    encoded = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    device = next(model.parameters()).device
    input_ids = encoded["input_ids"].to(device)
    was_training = model.training
    model.eval()
    try:
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=_MAX_NEW_TOKENS,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    finally:
        model.train(was_training)
    new_tokens = output[0, input_ids.shape[1]:]
    return tokenizer.decode(new_tokens, skip_special_tokens=True).strip()


def answer(model: Any, tokenizer: Any, question: str, *, system: str = DEMO_SYSTEM_PROMPT) -> str:
    """The model's answer to one user question under the demo system prompt."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return generate_reply(model, tokenizer, messages)


def ask_code(model: Any, tokenizer: Any, key: str) -> str:
    return answer(model, tokenizer, DEMO_QUESTION.format(key=key))


def mapping_accuracy(model: Any, tokenizer: Any, examples: list[dict[str, Any]]) -> float:
    """Share of chat examples whose final assistant message the model reproduces exactly.

    The prompt is every message before the last assistant one; the reply and
    the expected content are compared after stripping whitespace.
    """
    if not examples:
        raise ValueError("no examples to score")
    correct = 0
    for example in examples:
        messages = example["messages"]
        last = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
        prompt = [{"role": m["role"], "content": m["content"]} for m in messages[:last]]
        expected = messages[last]["content"].strip()
        correct += generate_reply(model, tokenizer, prompt) == expected
    return correct / len(examples)


def load_finetuned(base_dir: Path, adapter_dir: Path | None = None) -> tuple[Any, Any]:
    """Base model (plus a PEFT adapter folder, when given) and its tokenizer, on CPU."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    return model, tokenizer
