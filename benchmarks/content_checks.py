"""Throughput and quality of the content checks: exact and near dedup, contamination, PII.

    python benchmarks/content_checks.py [--rows 200000] [--baseline-rows 10000] [--seed 0]

Generates chat-like rows ("User: …\\nAssistant: …", 200-400 characters, words
from a made-up vocabulary so that only planted content looks like personal
data) and plants, at random positions, each a copy of an earlier row:

  exact     the earlier text with case and whitespace changed
  near      one or two words changed (exact character 5-gram Jaccard >= 0.92)
  near-miss more words changed (Jaccard 0.70-0.85): must NOT be reported
  contam.   a whole eval item as the user turn (and a short answer)
  contam.-  15 consecutive words of an eval item inside a long row: must not be flagged
  PII       one email / phone / card / IPv4 / IPv6 / SSN / secret per planted row,
            plus decoys (dates, versions, order numbers, bad-Luhn cards) that must not match

Then times each check over all rows in batches of 2048 (what the ingestion
pipeline uses) and prints rows/s, peak RSS, and precision/recall against the
planted truth, using the exact Jaccard of the 5-gram sets to judge every
reported near-duplicate pair. Finally it times a naive near-dedup baseline
(datasketch MinHash.update_batch per row + MinHashLSH query/insert) on the
first --baseline-rows rows, next to ours on the same rows.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata

from tuneforge.data import pii
from tuneforge.data.contamination import ContaminationIndex
from tuneforge.data.dedup import Deduplicator
from tuneforge.data.minhash import normalize_text

BATCH_ROWS = 2048
THRESHOLD = 0.9
NGRAM_CHARS = 5
PLANT_SHARES = {"exact": 0.02, "near": 0.02, "near_miss": 0.01, "contaminated": 0.005, "contamination_miss": 0.005,
                "pii": 0.01, "decoy": 0.01}
EVAL_ITEMS = 2000


@dataclass
class Corpus:
    texts: list[str]
    eval_items: list[str]
    planted: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # kind -> (row, source row)
    pii_kinds: Counter = field(default_factory=Counter)


# ---- the synthetic corpus ------------------------------------------------------
class Generator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.vocab = ["".join(self.rng.choices(letters, k=self.rng.randint(2, 10))) for _ in range(8000)]

    def words(self, low: int, high: int) -> list[str]:
        return self.rng.choices(self.vocab, k=self.rng.randint(low, high))

    def row(self) -> str:
        return f"User: {' '.join(self.words(14, 24)).capitalize()}?\nAssistant: {' '.join(self.words(22, 40))}."

    def reformat(self, text: str) -> str:
        """Same normalised text: case and whitespace changed."""
        words = text.split(" ")
        i = self.rng.randrange(len(words))
        words[i] = words[i].upper()
        return "  " + "  ".join(words).replace("\n", "\n\t ") + " \n"

    def edit(self, text: str, changes: int) -> str:
        words = text.split(" ")
        for _ in range(changes):
            words[self.rng.randrange(2, len(words))] = self.rng.choice(self.vocab)
        return " ".join(words)

    def pii_item(self) -> tuple[str, str]:
        r = self.rng
        items = [
            ("email", f"{r.choice(self.vocab)}.{r.choice(self.vocab)}@{r.choice(self.vocab)}.com"),
            ("phone", f"+44 20 {r.randint(1000, 9999)} {r.randint(1000, 9999)}"),
            ("credit_card", _card_number(r)),
            ("ipv4", f"{r.randint(11, 99)}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}"),
            ("ipv6", f"2001:db8:{r.randint(1, 0xFFFF):x}::{r.randint(1, 0xFFFF):x}"),
            ("us_ssn", f"{r.randint(100, 665)}-{r.randint(10, 99)}-{r.randint(1000, 9999)}"),
            ("aws_access_key", "AKIA" + "".join(r.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", k=16))),
            ("password", f"password={r.choice(self.vocab)}{r.randint(10, 99)}!"),
        ]
        return r.choice(items)

    def decoy(self) -> str:
        r = self.rng
        return r.choice([
            f"on {r.randint(2000, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
            f"version {r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 99)}.{r.randint(0, 9)}",
            f"order {r.randint(10**11, 10**12 - 1)}",
            "card 4111 1111 1111 1112",
            f"at {r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",
            "password= ",
        ])


def _card_number(rng: random.Random) -> str:
    digits = [4] + [rng.randint(0, 9) for _ in range(14)]
    total = sum(d if i % 2 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(reversed(digits)))
    digits.append((10 - total % 10) % 10)
    text = "".join(map(str, digits))
    return " ".join(text[i : i + 4] for i in range(0, 16, 4))


def build_corpus(rows: int, seed: int) -> Corpus:
    gen = Generator(seed)
    texts = [gen.row() for _ in range(rows)]
    eval_items = [" ".join(gen.words(24, 36)).capitalize() + "?" for _ in range(EVAL_ITEMS)]
    corpus = Corpus(texts=texts, eval_items=eval_items)
    positions = gen.rng.sample(range(1, rows), sum(int(rows * share) for share in PLANT_SHARES.values()))
    planted_rows = set(positions)
    cursor = 0
    for kind, share in PLANT_SHARES.items():
        chosen, cursor = positions[cursor : cursor + int(rows * share)], cursor + int(rows * share)
        corpus.planted[kind] = [(row, _earlier_base(gen.rng, row, planted_rows)) for row in chosen]
    for row, source in corpus.planted["exact"]:
        texts[row] = gen.reformat(texts[source])
    for kind, low, high in (("near", 0.92, 1.0), ("near_miss", 0.70, 0.85)):
        for row, source in corpus.planted[kind]:
            texts[row] = _edit_into(gen, texts[source], low, high)
    for row, _ in corpus.planted["contaminated"]:
        texts[row] = f"User: {gen.rng.choice(eval_items)}\nAssistant: {' '.join(gen.words(3, 5))}."
    for row, _ in corpus.planted["contamination_miss"]:
        item = gen.rng.choice(eval_items).split()
        texts[row] = texts[row] + " " + " ".join(item[:15])
    for row, _ in corpus.planted["pii"]:
        kind, value = gen.pii_item()
        corpus.pii_kinds[kind] += 1
        texts[row] = texts[row].replace("\nAssistant:", f" My detail is {value} ok.\nAssistant:")
    for row, _ in corpus.planted["decoy"]:
        texts[row] = texts[row].replace("\nAssistant:", f" It was {gen.decoy()} then.\nAssistant:")
    return corpus


def _earlier_base(rng: random.Random, row: int, planted: set[int]) -> int:
    while True:
        source = rng.randrange(row)
        if source not in planted:
            return source


def _edit_into(gen: Generator, text: str, low: float, high: float) -> str:
    """Change more and more words until the exact Jaccard falls into [low, high]."""
    for attempt in range(400):
        edited = gen.edit(text, 1 + attempt // 20)
        similarity = jaccard(text, edited)
        if low <= similarity <= high:
            return edited
        if similarity < low and attempt % 20 == 19:
            break
    return gen.edit(text, 0) + " and " + " ".join(gen.words(20, 30))  # rare: give up on this row, plant a far one


def jaccard(a: str, b: str, n: int = NGRAM_CHARS) -> float:
    grams_a, grams_b = _grams(normalize_text(a), n), _grams(normalize_text(b), n)
    return len(grams_a & grams_b) / len(grams_a | grams_b)


def _grams(text: str, n: int) -> set[str]:
    return {text[i : i + n] for i in range(len(text) - n + 1)} or {text}


# ---- timing -------------------------------------------------------------------
def batches(count: int):
    return ((start, min(count, start + BATCH_ROWS)) for start in range(0, count, BATCH_ROWS))


def time_dedup(texts: list[str], near: bool) -> tuple[float, list, Deduplicator]:
    dedup = Deduplicator(threshold=THRESHOLD, near=near)
    findings = []
    started = time.perf_counter()
    for start, end in batches(len(texts)):
        findings += dedup.add_batch(list(range(start, end)), texts[start:end])
    return len(texts) / (time.perf_counter() - started), findings, dedup


def time_contamination(corpus: Corpus) -> tuple[float, float, list]:
    index = ContaminationIndex()
    started = time.perf_counter()
    index.add_source("synthetic-eval", corpus.eval_items)
    build_s = time.perf_counter() - started
    findings = []
    started = time.perf_counter()
    for start, end in batches(len(corpus.texts)):
        findings += index.check_batch(list(range(start, end)), corpus.texts[start:end], threshold=0.5)
    return len(corpus.texts) / (time.perf_counter() - started), build_s, findings


def time_pii(texts: list[str]) -> tuple[float, Counter]:
    kinds: Counter = Counter()
    started = time.perf_counter()
    for text in texts:
        for match in pii.scan(text):
            kinds[match.kind] += 1
    return len(texts) / (time.perf_counter() - started), kinds


def datasketch_baseline(texts: list[str]) -> float:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=128)
    started = time.perf_counter()
    for row, text in enumerate(texts):
        normalised = normalize_text(text)
        minhash = MinHash(num_perm=128, seed=1)
        minhash.update_batch([gram.encode() for gram in _grams(normalised, NGRAM_CHARS)])
        lsh.query(minhash)
        lsh.insert(str(row), minhash)
    return len(texts) / (time.perf_counter() - started)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- quality ------------------------------------------------------------------
def dedup_quality(corpus: Corpus, findings: list) -> list[str]:
    texts = corpus.texts
    exact = [f for f in findings if f.kind == "exact_duplicate"]
    near = [f for f in findings if f.kind == "near_duplicate"]
    exact_true = sum(normalize_text(texts[f.line]) == normalize_text(texts[f.detail["duplicate_of"]]) for f in exact)
    near_true = sum(jaccard(texts[f.line], texts[f.detail["duplicate_of"]]) >= THRESHOLD for f in near)
    flagged = {f.line for f in findings}
    near_planted = [row for row, source in corpus.planted["near"] if jaccard(texts[row], texts[source]) >= THRESHOLD]
    misses = [row for row, _ in corpus.planted["near_miss"] if row in flagged]
    return [
        f"exact: {len(exact)} reported, {exact_true} true (precision {_ratio(exact_true, len(exact))}); "
        f"recall {_ratio(sum(r in flagged for r, _ in corpus.planted['exact']), len(corpus.planted['exact']))} "
        f"of {len(corpus.planted['exact'])} planted",
        f"near:  {len(near)} reported, {near_true} at exact Jaccard >= {THRESHOLD} (precision "
        f"{_ratio(near_true, len(near))}); recall {_ratio(sum(r in flagged for r in near_planted), len(near_planted))}"
        f" of {len(near_planted)} planted; near-misses (J 0.70-0.85) reported: {len(misses)} of "
        f"{len(corpus.planted['near_miss'])}",
    ]


def _ratio(part: int, whole: int) -> str:
    return f"{part / whole:.4f}" if whole else "n/a"


# ---- report -------------------------------------------------------------------
def machine_lines() -> list[str]:
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in ("numpy", "rensa", "datasketch"))
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return [f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"python {platform.python_version()}, {versions}",
            f"load average at start: {load} (1, 5, 15 min; other work on the machine skews the figures)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--baseline-rows", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("\n".join(machine_lines()))
    started = time.perf_counter()
    corpus = build_corpus(args.rows, args.seed)
    chars = sum(map(len, corpus.texts)) / len(corpus.texts)
    print(f"corpus: {args.rows} rows, {chars:.0f} characters a row on average, built in "
          f"{time.perf_counter() - started:.1f} s; peak RSS {peak_rss_mib():.0f} MiB")

    exact_rate, _, _ = time_dedup(corpus.texts, near=False)
    rss_before = peak_rss_mib()
    rate, findings, dedup = time_dedup(corpus.texts, near=True)
    print(f"exact dedup only:      {exact_rate:>9,.0f} rows/s")
    print(f"exact + near dedup:    {rate:>9,.0f} rows/s  (index {dedup.nbytes / 2**20:.0f} MiB; "
          f"peak RSS {peak_rss_mib():.0f} MiB, {rss_before:.0f} MiB before)")
    print("\n".join("  " + line for line in dedup_quality(corpus, findings)))

    contamination_rate, build_s, flagged = time_contamination(corpus)
    expected = {row for row, _ in corpus.planted["contaminated"]}
    caught = {f.line for f in flagged}
    print(f"contamination check:   {contamination_rate:>9,.0f} rows/s  (index of {EVAL_ITEMS} eval items built in "
          f"{build_s:.2f} s)")
    print(f"  {len(caught)} flagged: {len(caught & expected)} of {len(expected)} planted, "
          f"{len(caught - expected)} others ({len(caught & {r for r, _ in corpus.planted['contamination_miss']})} of "
          f"the {len(corpus.planted['contamination_miss'])} 15-word overlaps)")

    pii_rate, kinds = time_pii(corpus.texts)
    print(f"PII scan:              {pii_rate:>9,.0f} rows/s")
    print(f"  found {dict(sorted(kinds.items()))}")
    print(f"  planted {dict(sorted(corpus.pii_kinds.items()))}, plus {len(corpus.planted['decoy'])} decoys")

    subset = corpus.texts[: args.baseline_rows]
    baseline = datasketch_baseline(subset)
    ours, _, _ = time_dedup(subset, near=True)
    print(f"near dedup, first {len(subset)} rows: datasketch {baseline:,.0f} rows/s, ours {ours:,.0f} rows/s "
          f"({ours / baseline:.0f}x)")
    print(f"peak RSS: {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
