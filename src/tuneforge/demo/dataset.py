"""The demo task: memorize a made-up mapping of keys to short codes.

A random-weight base model cannot know invented facts such as "the code for
velmorix is QT-583", so it scores ~0 on them; an adapter that learned the
training file scores ~1. That makes the effect of fine-tuning visible in
seconds on a CPU.

The task is memorization, so the validation file asks about keys that are
also in the training file: its loss measures recall of the mapping, not
generalization.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO_SYSTEM_PROMPT = "You look up codes. Answer with the code only."
DEMO_QUESTION = "What is the code for {key}?"

# Keyword arguments of `tuneforge.domain.spec.Hyperparameters` (also the
# OpenAI job-create `hyperparameters` names where OpenAI has one). Measured with
# the default tiny model: see docs and benchmarks/demo_sft.py.
DEMO_HYPERPARAMETERS: dict[str, Any] = {
    "n_epochs": 50,
    "batch_size": 8,
    "learning_rate_multiplier": 1.0,
    "learning_rate": 1e-2,
    "warmup_ratio": 0.05,
    "lr_scheduler_type": "linear",
}
# Keyword arguments of `tuneforge.domain.spec.LoraConfig`.
DEMO_LORA: dict[str, Any] = {
    "rank": 16,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": "all-linear",
}

_SYLLABLES = ["vel", "mor", "ix", "tan", "qua", "zo", "rin", "bek", "dul", "fa", "gri", "oso"]
_CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"


@dataclass(frozen=True)
class MappingFact:
    key: str
    code: str


def demo_facts(n_keys: int = 24, seed: int = 0) -> list[MappingFact]:
    """`n_keys` distinct invented keys, each with a distinct code like `QT-583`."""
    rng = random.Random(seed)
    keys: list[str] = []
    codes: list[str] = []
    while len(keys) < n_keys:
        key = "".join(rng.choice(_SYLLABLES) for _ in range(3))
        if key not in keys:
            keys.append(key)
    while len(codes) < n_keys:
        code = f"{rng.choice(_CODE_LETTERS)}{rng.choice(_CODE_LETTERS)}-{rng.randint(100, 999)}"
        if code not in codes:
            codes.append(code)
    return [MappingFact(key, code) for key, code in zip(keys, codes)]


def chat_example(fact: MappingFact) -> dict[str, Any]:
    """One OpenAI chat-format training line for `fact`."""
    return {
        "messages": [
            {"role": "system", "content": DEMO_SYSTEM_PROMPT},
            {"role": "user", "content": DEMO_QUESTION.format(key=fact.key)},
            {"role": "assistant", "content": fact.code},
        ]
    }


def demo_examples(n_keys: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """The training examples: one chat line per fact."""
    return [chat_example(fact) for fact in demo_facts(n_keys, seed)]


def validation_examples(
    examples: list[dict[str, Any]], count: int = 6, seed: int = 0
) -> list[dict[str, Any]]:
    """A deterministic sample of the training examples (see the module docstring)."""
    rng = random.Random(seed + 1)
    return rng.sample(examples, min(count, len(examples)))


def write_jsonl(path: Path, examples: Iterable[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for example in examples:
            handle.write(json.dumps(example, ensure_ascii=False) + "\n")
    return path


@dataclass(frozen=True)
class DemoFiles:
    training_path: Path
    validation_path: Path
    examples: list[dict[str, Any]]


def write_demo_files(out_dir: Path, *, n_keys: int = 24, seed: int = 0) -> DemoFiles:
    """Write `demo_train.jsonl` and `demo_valid.jsonl` into `out_dir`."""
    out_dir = Path(out_dir)
    examples = demo_examples(n_keys, seed)
    training_path = write_jsonl(out_dir / "demo_train.jsonl", examples)
    validation_path = write_jsonl(
        out_dir / "demo_valid.jsonl", validation_examples(examples, seed=seed)
    )
    return DemoFiles(training_path, validation_path, examples)
