"""Continued pre-training (`cpt`) on raw text: `{"text": ...}` lines.

Each document is tokenized as the tokenizer encodes plain text (its BOS, if
any, in front) with EOS appended, and every token is a target. A document
longer than `max_seq_length` is cut into consecutive windows of that length
(nothing is dropped); the windows are examples of their own, packed into rows
with the others like any supervised example, so attention and loss never
cross from one document or window into the next. The loss is supervised
fine-tuning's (next-token cross-entropy per token); held-out perplexity is
exp(validation loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuneforge.data.errors import BadDataError
from tuneforge.data.tokenize import TokenizedExample
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.methods import NoOptions
from tuneforge.train.objective import TokenObjective


def tokenize_text(text: Any, tokenizer: Any, *, max_seq_length: int) -> list[TokenizedExample]:
    if not isinstance(text, str) or not text.strip():
        raise BadDataError("invalid_example", "'text' must be a non-empty string", param="text")
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        ids.append(tokenizer.eos_token_id)
    size = max(2, max_seq_length)
    return [TokenizedExample(ids[start:start + size], ids[start:start + size])
            for start in range(0, len(ids), size) if len(ids[start:start + size]) > 1]


def load_texts(store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *,
               label: str, base_model_sha256: str = "") -> Sequence[TokenizedExample]:
    """Every window of every document, tokenized into shards on local disk (streamed, cached
    beside a prepared dataset like a supervised file's tokens: `train/token_shards.py`)."""
    from tuneforge.train.batches import stream_tokenized

    def encode(record: Any) -> list[TokenizedExample]:
        if not isinstance(record, dict) or "text" not in record:
            raise BadDataError("invalid_example", "expected a 'text' string", param="text")
        return tokenize_text(record["text"], tokenizer, max_seq_length=hp.max_seq_length)

    return stream_tokenized(store, ref, tokenizer, hp, encode, label=label, kind="text",
                            base_model_sha256=base_model_sha256)


def build(options: NoOptions) -> TokenObjective:
    return TokenObjective("cpt", load_texts)

