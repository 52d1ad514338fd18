"""The check's fast paths (plain chats, batch PII gate, whole-batch word lookups,
pre-token counts, batch statistics) report exactly what the plain paths report."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tuneforge.data import pii, shapes, structure
from tuneforge.data.pipeline import CheckOptions, check_dataset
from tuneforge.data.report import Histogram
from tuneforge.data.token_count import PieceCounter
from tuneforge.data.wordtable import WordTable

WORDS = ("the model reads don't it's we'll they've I'm !!! ... -- (case) 3.14 2026-11-30 12345 007 x2 "
         "naïve café 漢字 テスト 🙂 internationalization supercalifragilisticexpialidocious "
         "<|im_end|> <|pad|>x e-mail: ok? yes. A B C ĠHello").split(" ")
SPECIAL_TEXTS = ["  leading", "trailing  ", "double  space", "tab\tand\nnewline", "a\u00a0b", "end. ",
                 " ", "mail jane.doe@example.com now", "card 4111 1111 1111 1111 ok", "password=hunter22",
                 "call +44 20 7946 0958", "ip 192.168.1.10", "case 123456 in 2024", "v1.2.3.4 released"]


def _message(role: str, rng: random.Random, i: int) -> dict[str, Any]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
    if (i // 512) % 2 and rng.random() < 0.2:  # rows 512-1023: batches of plain texts before and after
        text += " " + rng.choice(SPECIAL_TEXTS)
    if rng.random() < 0.3:
        text += f" (case {i * 7919 % 1000003})?"
    return {"role": role, "content": text}


def _lines(rows: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    lines: list[str] = []
    records: list[dict[str, Any]] = []
    for i in range(rows):
        roll = rng.random()
        record: Any = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                    _message("user", rng, i), _message("assistant", rng, i)]}
        if records and roll < 0.04:
            record = json.loads(json.dumps(rng.choice(records)))  # exact duplicate
        elif records and roll < 0.08:
            record = json.loads(json.dumps(rng.choice(records)))
            record["messages"][-1]["content"] += " ok"  # near duplicate
        elif roll < 0.10:
            lines.append('{"messages": [ broken')
            continue
        elif roll < 0.11:
            record["messages"] = record["messages"][1:][::-1]  # assistant first
        elif roll < 0.12:
            record["messages"][2]["content"] = "   "  # a blank answer
        elif roll < 0.13:
            record["messages"][1]["content"] = ""  # a blank question: a warning
        elif roll < 0.14:
            record["messages"].insert(2, {"role": "system", "content": "late system turn"})
        elif roll < 0.15:
            record["messages"][2]["weight"] = 0
            record["messages"].append({"role": "user", "content": "more"})
            record["messages"].append({"role": "assistant", "content": "weighted", "weight": 1})
        elif roll < 0.16:
            record["messages"][1]["content"] = [{"type": "text", "text": "parts "}, {"type": "text", "text": "x"}]
        elif roll < 0.17:
            record["extra"] = 1
        elif roll < 0.18:
            record["messages"].pop()  # ends with the user's turn
        elif roll < 0.19:
            record["messages"][1]["role"] = "robot"
        elif roll < 0.20:
            record["messages"].insert(1, {"role": "developer", "content": "second"})
        elif roll < 0.21:
            record = {"prompt": "an instruction", "completion": "in a chat file"}
        elif roll < 0.22:
            record["messages"][2]["content"] = " ".join(["long"] * 600)  # over max_seq_length
        else:
            records.append(record)  # a plain chat, to be repeated later
        lines.append(json.dumps(record, ensure_ascii=rng.random() < 0.5))
    return lines


def _check(path: Path, tokenizer: Any, workers: int, **options: Any) -> dict[str, Any]:
    check = CheckOptions(max_seq_length=256, min_examples=1, batch_rows=128, workers=workers,
                         parallel_min_bytes=0, **options)
    return check_dataset(path, check, tokenizer=tokenizer).to_dict()


def _plain_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check as it runs without any fast path: every record through the full shape check,
    every text through the PII scan, every field through the tokenizer, statistics one by one."""
    monkeypatch.setattr(shapes, "plain_chat", lambda record, line: None)
    monkeypatch.setattr(structure, "plain_chat", lambda record, line: None)
    monkeypatch.setattr(pii, "scan_candidates", lambda texts: [True] * len(texts))
    monkeypatch.setattr(PieceCounter, "lengths", lambda self, texts: self._tokenize(texts))

    def add_each(self: Histogram, values: list[int]) -> None:
        for value in values:
            self.add(value)

    monkeypatch.setattr(Histogram, "add_many", add_each)


@pytest.mark.parametrize("policy", ["warn", "redact"])
def test_fast_paths_report_what_the_plain_paths_report(tmp_path: Path, tokenizer: Any,
                                                       monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(_lines(1500)) + "\n")
    fast = _check(path, tokenizer, workers=1, pii_policy=policy)
    parallel = _check(path, tokenizer, workers=2, pii_policy=policy)
    with monkeypatch.context() as patch:
        _plain_paths(patch)
        plain = _check(path, tokenizer, workers=1, pii_policy=policy)
    assert fast == plain
    assert parallel == plain
    # the file really holds what the fast paths special-case
    assert plain["duplicates"]["counts"]["exact_duplicate"] > 20
    assert plain["duplicates"]["counts"]["near_duplicate"] > 5
    assert plain["pii"]["counts"]["pii:email"] > 5
    assert {"invalid_json", "role_order", "empty_turn", "unknown_key", "invalid_role"} <= set(plain["errors"])
    assert plain["warnings"]["truncated"]["count"] > 5


def test_word_table_answers_what_it_was_told_through_collisions_and_clearing() -> None:
    rng = random.Random(5)
    vocabulary = [w for w in WORDS if " " not in w and w] + [str(rng.randint(0, 10**9)) for _ in range(300)]
    truth = {word: len(word.encode()) % 7 + 1 for word in vocabulary}
    asked: list[str] = []

    def count_missing(words: list[str]) -> list[int]:
        asked.extend(words)
        return [truth[word] for word in words]

    table = WordTable(slot_bits=4)  # 16 slots: words collide and the table empties itself often
    for _ in range(200):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(1, 40))]
        counts = table.counts(" ".join(words).encode(), count_missing)
        assert counts.tolist() == [truth[word] for word in words]
        assert len(table) <= 16
    assert len(asked) < 200 * 20  # the table did answer some words itself


def test_word_counts_past_the_self_check_equal_the_tokenizer(tokenizer: Any) -> None:
    """Whole-batch lookups and pre-token counts themselves, not the self-check that would hide a mistake."""
    rng = random.Random(11)
    backend = tokenizer.backend_tokenizer
    counter = PieceCounter(backend.encode_batch, backend)
    plain = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 25))) + f" {rng.randint(0, 10**7)})?"
             for _ in range(3000)]
    mixed = plain[:1000] + SPECIAL_TEXTS * 20
    counter.lengths(plain[:600])  # past the self-check
    for batch in (plain[600:1800], mixed, plain[1800:], [""], ["x"], ["", " ", "a b"]):
        real = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in batch]
        assert counter.lengths(batch) == real
    assert counter.active
    assert len(counter._table) > 100 and counter._pre is not None and counter._pre.size > 100
