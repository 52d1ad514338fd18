"""A few examples of a fine-tune file as the trainer will see them: rendered through a base
model's chat template and tokenized, each token marked with whether it carries loss (the loss
mask: assistant turns with weight 1, a completion and its EOS; every token with
`train_on_inputs`). What the console's dataset page highlights.

Only the first examples are read: a JSONL file streams from the object store and reading
stops after `limit` examples; other formats are copied locally first, as the checks do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.data.errors import BadDataError
from tuneforge.data.example import DataIssue, Example
from tuneforge.data.formats import iter_jsonl_stream
from tuneforge.data.shapes import normalize
from tuneforge.data.structure import StructureReport, iter_examples
from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample, tokenize_chat, tokenize_example
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.domain.errors import invalid
from tuneforge.services.context import Platform
from tuneforge.services.datasets import checks as datasets
from tuneforge.services.datasets import files as file_service
from tuneforge.services.datasets.tokenizers import tokenizer_for
from tuneforge.storage import layout

MAX_EXAMPLES = 10
MAX_TOKENS = 4096  # shown per example; a longer one is marked truncated


def preview(session: Session, platform: Platform, tenant_id: str, file_id: str, model: str, limit: int,
            max_seq_length: int, train_on_inputs: bool) -> dict[str, Any]:
    row = file_service.get(session, tenant_id, file_id)
    if row.purpose != "fine-tune":
        raise invalid(f"{file_id} has purpose {row.purpose!r}; only fine-tune files are previewed", param="file_id",
                      code="invalid_file_purpose")
    base = base_model_repo.by_name(session, model)
    if base is None:
        raise invalid(f"Model {model!r} is not a base model of this platform", param="model",
                      code="model_not_available")
    tokenizer = tokenizer_for(platform.store, base, layout.home_base_model_cache_dir(platform.settings.home))
    shown = []
    for example in _first_examples(platform, row, limit):
        try:
            tokenized = _tokenized(example, tokenizer, max_seq_length, train_on_inputs)
        except BadDataError as exc:
            shown.append({"line": example.line, "error": {"code": exc.code, "message": exc.message}, "tokens": [],
                          "num_tokens": 0, "num_trained_tokens": 0, "truncated": False})
            continue
        ids, labels = tokenized.input_ids[:MAX_TOKENS], tokenized.labels[:MAX_TOKENS]
        shown.append({
            "line": example.line,
            "tokens": [{"text": tokenizer.decode([token]), "trained": label != IGNORE_INDEX}
                       for token, label in zip(ids, labels)],
            "num_tokens": len(ids), "num_trained_tokens": sum(label != IGNORE_INDEX for label in labels),
            "truncated": len(tokenized.input_ids) > MAX_TOKENS,
        })
    return {"object": "file.preview", "file_id": row.file_id, "model": base.name, "max_seq_length": max_seq_length,
            "train_on_inputs": train_on_inputs, "examples": shown}


def _first_examples(platform: Platform, row: Any, limit: int) -> Iterator[Example]:
    found = 0
    if row.filename.lower().endswith(".jsonl"):  # streamed: only the first lines are read
        with platform.store.open_read(row.key) as stream:
            for line, item in iter_jsonl_stream(stream):
                if found >= limit:
                    return
                example = _normalized(item, line)
                if example is not None:
                    found += 1
                    yield example
        return
    with datasets.local_copy(platform.store, row.key, suffix="-" + row.filename) as path:
        for example in iter_examples(path, report=StructureReport(), name=row.filename):
            if found >= limit:
                return
            found += 1
            yield example


def _normalized(item: Any, line: int) -> Example | None:
    if isinstance(item, DataIssue):
        return None
    try:
        return normalize(item, line)[0]
    except DataIssue:
        return None


def _tokenized(example: Example, tokenizer: Any, max_seq_length: int, train_on_inputs: bool) -> TokenizedExample:
    if example.kind == "preference":  # the preferred answer is what the loss is on
        return tokenize_chat(list(example.messages or []) + [example.chosen], tokenizer,
                             max_seq_length=max_seq_length, train_on_inputs=train_on_inputs, tools=example.tools)
    if example.kind == "text":  # continued pre-training: every token
        ids = list(tokenizer(example.text or "", add_special_tokens=True)["input_ids"])[:max_seq_length]
        return TokenizedExample(ids, list(ids))
    return tokenize_example(datasets.example_record(example), tokenizer, max_seq_length=max_seq_length,
                            train_on_inputs=train_on_inputs)
