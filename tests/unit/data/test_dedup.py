"""Dedup: exact repeats through normalisation, near duplicates by exact Jaccard,
near misses never reported, first occurrence kept, the same answers however
the rows are batched."""

from __future__ import annotations

import random
import string
import unicodedata

import numpy as np
import pytest

from tuneforge.data.dedup import Deduplicator, lsh_bands
from tuneforge.data.example import Example
from tuneforge.data.keytable import KeyTable
from tuneforge.data.minhash import MinHasher, normalize_batch, normalize_text

WORDS = ["".join(random.Random(i).choices(string.ascii_lowercase, k=3 + i % 7)) for i in range(3000)]


def sentence(rng: random.Random, words: int = 55) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def jaccard(a: str, b: str, n: int = 5) -> float:
    """The reference: exact Jaccard of the character n-gram sets of the normalised texts."""
    grams_a, grams_b = ({t[i : i + n] for i in range(len(t) - n + 1)} for t in (normalize_text(a), normalize_text(b)))
    return len(grams_a & grams_b) / len(grams_a | grams_b)


def edit_into(rng: random.Random, text: str, low: float, high: float) -> str:
    """Replace words until the exact Jaccard with `text` falls into [low, high]."""
    for attempt in range(1000):
        words = text.split(" ")
        for _ in range(1 + attempt // 50):
            words[rng.randrange(1, len(words))] = rng.choice(WORDS)
        edited = " ".join(words)
        if low <= jaccard(text, edited) <= high:
            return edited
    raise AssertionError("no edit in range")


def findings_of(dedup: Deduplicator, texts: list[str], batch_rows: int = 1000, first_line: int = 1) -> list:
    found = []
    for start in range(0, len(texts), batch_rows):
        lines = list(range(first_line + start, first_line + min(len(texts), start + batch_rows)))
        found += dedup.add_batch(lines, texts[start : start + batch_rows])
    return [(f.line, f.kind, f.detail["duplicate_of"], f.detail.get("jaccard")) for f in found]


# ---- normalisation ------------------------------------------------------------
def test_every_unicode_whitespace_collapses_like_str_split() -> None:
    spaces = [chr(c) for c in range(0x3100) if chr(c).isspace()]
    texts = [f" a{space}{space}b{space}" for space in spaces] + ["x\x00y", "Ｈｅｌｌｏ  ＷＯＲＬＤ", "Straße\u00a0Café"]
    assert [normalize_text(t) for t in texts[: len(spaces)]] == ["a b"] * len(spaces)
    assert normalize_batch(texts).texts == [normalize_text(t) for t in texts]
    assert normalize_text("Ｈｅｌｌｏ  ＷＯＲＬＤ") == "hello world"
    assert normalize_text("Straße\u00a0Café") == unicodedata.normalize("NFKC", "strasse café")


# ---- exact ----------------------------------------------------------------------
def test_exact_duplicates_through_case_whitespace_and_width_are_found_once_each() -> None:
    base = "The quick brown fox jumps over the lazy dog near the river bank."
    texts = [
        base,  # line 1
        "Something else entirely, about cats.",  # 2
        "  THE QUICK brown fox\tjumps over the\n\nlazy dog near the river bank. ",  # 3: exact of 1
        "Ｔｈｅ quick brown fox jumps over the lazy dog near the river bank.",  # 4: exact of 1 (full width)
        "something ELSE entirely,  about cats.",  # 5: exact of 2
        "The quick brown fox jumps over the lazy dog near the river bank!",  # 6: differs
    ]
    found = findings_of(Deduplicator(), texts)
    assert [f for f in found if f[1] == "exact_duplicate"] == [
        (3, "exact_duplicate", 1, None), (4, "exact_duplicate", 1, None), (5, "exact_duplicate", 2, None)]


def test_first_occurrence_is_kept_across_batches() -> None:
    dedup = Deduplicator()
    assert dedup.add_batch([10, 11], ["alpha beta gamma delta", "one two three four five"]) == []
    later = dedup.add_batch([20, 21, 22],
                            ["ALPHA beta  gamma delta", "one two three four five", "alpha beta gamma delta"])
    assert [(f.line, f.detail) for f in later] == [(20, {"duplicate_of": 10}), (21, {"duplicate_of": 11}),
                                                  (22, {"duplicate_of": 10})]
    assert dedup.duplicate_lines() == {20, 21, 22}


def test_short_and_empty_texts_only_match_exactly() -> None:
    found = findings_of(Deduplicator(), ["ok", "ok!", "OK", "", " \n", "abcd", "abce"])
    assert found == [(3, "exact_duplicate", 1, None), (5, "exact_duplicate", 4, None)]


# ---- near -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def planted() -> tuple[list[str], dict[int, int], dict[int, int], dict[int, int]]:
    """300 distinct texts, then 30 exact copies, 30 near duplicates (J >= 0.9)
    and 30 near misses (0.70 <= J <= 0.85) of earlier ones, at known lines."""
    rng = random.Random(7)
    texts = [sentence(rng) for _ in range(300)]
    exact, near, misses = {}, {}, {}
    for kind in ("exact", "near", "miss") * 30:
        source = rng.randrange(300)
        if kind == "exact":
            texts.append("  " + texts[source].upper().replace(" ", "   ") + "\n")
            exact[len(texts)] = source + 1
        elif kind == "near":
            texts.append(edit_into(rng, texts[source], 0.9, 0.99))
            near[len(texts)] = source + 1
        else:
            texts.append(edit_into(rng, texts[source], 0.70, 0.85))
            misses[len(texts)] = source + 1
    return texts, exact, near, misses


def test_planted_near_duplicates_found_with_their_exact_jaccard_and_near_misses_not(planted) -> None:
    texts, exact, near, misses = planted
    found = findings_of(Deduplicator(), texts, batch_rows=64)
    assert {line: of for line, kind, of, _ in found if kind == "exact_duplicate"} == exact
    reported = {line: (of, similarity) for line, kind, of, similarity in found if kind == "near_duplicate"}
    assert {line: of for line, (of, _) in reported.items()} == near
    for line, (of, similarity) in reported.items():
        assert similarity == round(jaccard(texts[line - 1], texts[of - 1]), 4)
        assert similarity >= 0.9
    assert not set(misses) & {line for line, *_ in found}


def test_pair_just_under_the_threshold_is_not_reported_and_just_over_is() -> None:
    rng = random.Random(3)
    base = sentence(rng, 70)
    under, over = edit_into(rng, base, 0.86, 0.895), edit_into(rng, base, 0.905, 0.93)
    found = findings_of(Deduplicator(threshold=0.9), [base, under, over])
    assert [(line, kind, of) for line, kind, of, _ in found] == [(3, "near_duplicate", 1)]


def test_same_findings_whatever_the_batching_and_for_the_same_seed(planted) -> None:
    texts = planted[0]
    reference = findings_of(Deduplicator(seed=0), texts, batch_rows=len(texts))
    assert findings_of(Deduplicator(seed=0), texts, batch_rows=1) == reference
    assert findings_of(Deduplicator(seed=0), texts, batch_rows=37) == reference
    assert findings_of(Deduplicator(seed=5), texts, batch_rows=37) == reference  # verification is exact


def test_signatures_are_deterministic_by_seed() -> None:
    batch = normalize_batch(["some text to sketch here", "another one, a bit longer than that"])
    keys = np.arange(2, dtype=np.uint64)
    first, again, other = (MinHasher(seed=s).signatures(batch, keys) for s in (1, 1, 2))
    assert (first == again).all() and not (first == other).all()


def test_non_latin_text_in_mixed_batches() -> None:
    rng = random.Random(11)
    cyrillic = "".join(rng.choice("абвгдежзийклмнопрстуфхцчшщыэюя ") for _ in range(400))
    near = cyrillic[:200] + "ъ" + cyrillic[201:]
    latin = "café crème brûlée " * 20
    texts = ["plain ascii text " * 10, cyrillic, latin, near, latin.upper(), "日本語のテキスト" * 10]
    found = findings_of(Deduplicator(), texts, batch_rows=2)
    assert [(line, kind, of) for line, kind, of, _ in found] == [(4, "near_duplicate", 2), (5, "exact_duplicate", 3)]


def test_add_examples_uses_the_joined_text() -> None:
    chat = Example(line=1, kind="chat", messages=[{"role": "user", "content": "Hi there, how are you doing?"},
                                                  {"role": "assistant", "content": "Fine, thanks."}])
    same = Example(line=2, kind="instruction", prompt="hi there, how are you doing?", completion="FINE, thanks.")
    found = Deduplicator().add_examples([chat, same])
    assert [(f.line, f.kind, f.detail) for f in found] == [(2, "exact_duplicate", {"duplicate_of": 1})]


def test_near_detection_can_be_switched_off() -> None:
    rng = random.Random(5)
    base = sentence(rng)
    found = findings_of(Deduplicator(near=False), [base, edit_into(rng, base, 0.92, 0.99), base])
    assert found == [(3, "exact_duplicate", 1, None)]


def test_lsh_bands_find_a_pair_at_the_threshold_with_high_probability() -> None:
    assert lsh_bands(0.9, 128) == (6, 5)
    for threshold in (0.5, 0.7, 0.8, 0.9, 0.95):
        bands, rows = lsh_bands(threshold, 128)
        assert bands * rows <= 128
        assert 1 - (1 - threshold**rows) ** bands >= 0.995


# ---- the table under it -----------------------------------------------------------
def test_key_table_first_insert_wins_and_survives_growth() -> None:
    rng = np.random.default_rng(0)
    table, reference = KeyTable(), {}
    for batch in range(40):
        keys = rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64)
        keys[:50] = keys[50:100]  # repeats inside the batch
        values = np.arange(batch * 5000, (batch + 1) * 5000)
        got = table.lookup_or_insert(keys, values)
        expected, fresh = [], {}
        for key, value in zip((keys >> np.uint64(32)).tolist(), values.tolist()):
            if key in reference:
                expected.append(reference[key])
            elif key in fresh:
                expected.append(fresh[key])
            else:
                fresh[key] = value
                expected.append(-1)
        reference.update(fresh)
        assert got.tolist() == expected
    assert len(table) == len(reference)
