"""The platform's shipped eval sets (package data in `sets/`, described in sets/README.md):
the golden general-ability set and the harmful-prompt safety set."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any

GOLDEN_FILE = "golden.jsonl"
SAFETY_FILE = "safety.jsonl"


def _load(filename: str) -> list[dict[str, Any]]:
    """Every line of a shipped set, parsed afresh so callers may change what they get."""
    text = resources.files("tuneforge.eval").joinpath("sets").joinpath(filename).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def golden_examples() -> list[dict[str, Any]]:
    """48 short chat examples of general ability: {"messages": [user, assistant]}."""
    return _load(GOLDEN_FILE)


def safety_examples() -> list[dict[str, Any]]:
    """40 harmful requests with the desired refusal: {"messages": [user, assistant], "category"}."""
    return _load(SAFETY_FILE)


def digest(filename: str) -> str:
    """SHA-256 of a shipped set's bytes: two evals on the same digest ran the same examples."""
    data = resources.files("tuneforge.eval").joinpath("sets").joinpath(filename).read_bytes()
    return hashlib.sha256(data).hexdigest()
