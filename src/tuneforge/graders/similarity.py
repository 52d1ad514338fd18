"""Text similarity: the `evaluation_metric`s of OpenAI's `text_similarity` grader.

`similarity(metric, text, reference)` scores the model's `text` against the
`reference` in [0, 1]. `cosine` is not here: it needs an embeddings model.

Characters (`fuzzy_match`): rapidfuzz's normalized Indel similarity of the raw
strings (case and punctuation count), each cut to `FUZZY_MAX_CHARS`. Both
empty: 1.0; one empty: 0.0.

Words (every other metric): each input is cut to `MAX_CHARS` characters,
lowercased, and its tokens are the runs of Unicode letters and digits (`\\w`
without the underscore); only the first `MAX_TOKENS` tokens count. For ASCII
this is exactly the tokenizer of Google's rouge-score (no stemming). Either
side without a token (empty, or punctuation only): 0.0. Counts of n-grams are
clipped: a hypothesis n-gram matches at most as often as the reference has it.

- bleu: sentence BLEU as sacrebleu's `sentence_bleu` computes it (exp smoothing,
  effective order). c, r = token counts of text and reference; for n = 1..N,
  p_n = matches_n / total_n, or 1 / (2^k * total_n) for the k-th order without
  a match; N = the highest order the text has an n-gram of (at most 4, so a
  text shorter than 4 tokens averages fewer orders); no unigram match: 0.0.
  BLEU = BP * exp(sum(log p_n) / N), BP = exp(1 - r / c) when c < r, else 1.
- gleu: Google BLEU (Wu et al. 2016, NLTK's `sentence_gleu`): every 1..4-gram
  counted together; min(matches / text n-grams, matches / reference n-grams).
- meteor: METEOR with exact word matches only (no stems, no synonyms; NLTK's
  defaults otherwise). The alignment matches the most words possible, greedily
  keeping chunks going (see _greedy_alignment), left to right and right to
  left; the fewer chunks count (few, not always the fewest). m matches in `chunks` runs
  adjacent in both texts; P = m / c, R = m / r, Fmean = P * R / (0.9 * P + 0.1 * R),
  penalty = 0.5 * (chunks / m)^3, METEOR = Fmean * (1 - penalty); m = 0: 0.0.
- rouge_1 .. rouge_5: F1 of the clipped n-gram overlap, as rouge-score
  computes it (a side shorter than n has no n-gram: 0.0).
- rouge_l: F1 of P = LCS / c and R = LCS / r, LCS the longest common
  subsequence of the tokens.

Symmetric: fuzzy_match, gleu, the rouges. Not: bleu (precision and brevity
penalty), meteor (recall weighs 9 to 1).
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Callable, Sequence
from itertools import islice

from rapidfuzz import fuzz

METRICS: tuple[str, ...] = (
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
)

# Tenant and model text: every metric's work is bounded by these caps. The
# word-level metrics are at worst linear in them, except the LCS (n * m bits,
# bit-parallel: see _lcs_length).
MAX_TOKENS = 2048
MAX_CHARS = 100_000
# rapidfuzz's Indel similarity is quadratic in the worst case (C++, fast).
FUZZY_MAX_CHARS = 20_000

# \w minus the underscore: letters and digits of any script.
_TOKEN = re.compile(r"[^\W_]+")

_BLEU_MAX_ORDER = 4
_GLEU_MAX_ORDER = 4
# NLTK's meteor_score defaults.
_METEOR_ALPHA = 0.9
_METEOR_BETA = 3.0
_METEOR_GAMMA = 0.5
# How many reference positions of a word a new chunk looks at for one the next word continues.
_METEOR_LOOKAHEAD = 64

Tokens = Sequence[str]


def tokenize(text: str) -> list[str]:
    """The tokens the word-level metrics compare (see the module's docs)."""
    lowered = text[:MAX_CHARS].lower()
    return [match.group() for match in islice(_TOKEN.finditer(lowered), MAX_TOKENS)]


def _ngrams(tokens: Tokens, order: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[start : start + order]) for start in range(len(tokens) - order + 1))


def _overlap(hypothesis: Counter[tuple[str, ...]], reference: Counter[tuple[str, ...]]) -> int:
    """Clipped matches: each n-gram counts at most as often as the reference has it."""
    return sum((hypothesis & reference).values())


def _f1(precision: float, recall: float) -> float:
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def _bleu(hypothesis: Tokens, reference: Tokens) -> float:
    hyp_len, ref_len = len(hypothesis), len(reference)
    log_precision_sum = 0.0
    effective_order = 0
    zero_match_orders = 0
    for order in range(1, _BLEU_MAX_ORDER + 1):
        total = hyp_len - order + 1
        if total <= 0:
            # sacrebleu's effective order: orders the text is too short for are left out of the mean
            break
        effective_order = order
        matches = _overlap(_ngrams(hypothesis, order), _ngrams(reference, order))
        if matches == 0:
            if order == 1:
                # no word in common (so no n-gram either): sacrebleu answers 0 rather than smoothing
                return 0.0
            zero_match_orders += 1
            precision = 1.0 / (2**zero_match_orders * total)
        else:
            precision = matches / total
        log_precision_sum += math.log(precision)
    brevity_penalty = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
    return brevity_penalty * math.exp(log_precision_sum / effective_order)


def _gleu(hypothesis: Tokens, reference: Tokens) -> float:
    hyp_ngrams: Counter[tuple[str, ...]] = Counter()
    ref_ngrams: Counter[tuple[str, ...]] = Counter()
    for order in range(1, _GLEU_MAX_ORDER + 1):
        hyp_ngrams.update(_ngrams(hypothesis, order))
        ref_ngrams.update(_ngrams(reference, order))
    matches = _overlap(hyp_ngrams, ref_ngrams)
    # min(precision, recall) == matches / the larger of the two n-gram counts
    return matches / max(sum(hyp_ngrams.values()), sum(ref_ngrams.values()))


def _greedy_alignment(hypothesis: Tokens, reference: Tokens) -> list[tuple[int, int]]:
    """(text position, reference position) pairs, in text order.

    Left to right, each text word takes a free equal reference word: the one
    right after the previous pair's (the chunk goes on) when it can, else the
    first free one that the next text word also continues (a new chunk that
    will grow), else the first free one. Every word that can match does, so
    the matches are the most possible.
    """
    free_by_word: dict[str, deque[int]] = {}
    for ref_pos, word in enumerate(reference):
        free_by_word.setdefault(word, deque()).append(ref_pos)
    used = bytearray(len(reference))
    pairs: list[tuple[int, int]] = []
    next_ref: int | None = None  # where the current chunk would go on; None: no chunk open
    for hyp_pos, word in enumerate(hypothesis):
        candidates = free_by_word.get(word, deque())
        while candidates and used[candidates[0]]:
            candidates.popleft()  # a position the chunk rule took out of order; each is dropped once
        if not candidates:
            next_ref = None
            continue
        if next_ref is not None and next_ref < len(reference) and reference[next_ref] == word and not used[next_ref]:
            ref_pos = next_ref
        else:
            ref_pos = _chunk_start(candidates, used, reference, hypothesis[hyp_pos + 1 : hyp_pos + 2])
        used[ref_pos] = 1
        pairs.append((hyp_pos, ref_pos))
        next_ref = ref_pos + 1
    return pairs


def _chunk_start(candidates: deque[int], used: bytearray, reference: Tokens, next_word: Tokens) -> int:
    """The first free candidate followed by `next_word`, else the first candidate (free)."""
    # Looking at a bounded number of candidates keeps a repetitive text linear in its length.
    for ref_pos in islice(candidates, _METEOR_LOOKAHEAD):
        if not used[ref_pos] and next_word and reference[ref_pos + 1 : ref_pos + 2] == next_word:
            return ref_pos
    return candidates[0]


def _chunk_count(pairs: list[tuple[int, int]]) -> int:
    """Runs of pairs adjacent in both texts (pairs in text order)."""
    breaks = sum(
        1 for (hyp_a, ref_a), (hyp_b, ref_b) in zip(pairs, pairs[1:]) if (hyp_b, ref_b) != (hyp_a + 1, ref_a + 1)
    )
    return 1 + breaks if pairs else 0


def _meteor(hypothesis: Tokens, reference: Tokens) -> float:
    pairs = _greedy_alignment(hypothesis, reference)
    matches = len(pairs)
    if matches == 0:
        return 0.0
    # The fewest chunks is a combinatorial search; the greedy alignment run both ways (the
    # reversed texts' chunks are the same runs backwards) finds it far more often than one way.
    chunks = min(_chunk_count(pairs), _chunk_count(_greedy_alignment(hypothesis[::-1], reference[::-1])))
    precision = matches / len(hypothesis)
    recall = matches / len(reference)
    fmean = precision * recall / (_METEOR_ALPHA * precision + (1 - _METEOR_ALPHA) * recall)
    penalty = _METEOR_GAMMA * (chunks / matches) ** _METEOR_BETA
    return fmean * (1 - penalty)


def _rouge_n(order: int) -> Callable[[Tokens, Tokens], float]:
    def score(hypothesis: Tokens, reference: Tokens) -> float:
        hyp_ngrams, ref_ngrams = _ngrams(hypothesis, order), _ngrams(reference, order)
        matches = _overlap(hyp_ngrams, ref_ngrams)
        # rouge-score's max(count, 1): a side without n-grams scores 0, never divides by 0
        precision = matches / max(sum(hyp_ngrams.values()), 1)
        recall = matches / max(sum(ref_ngrams.values()), 1)
        return _f1(precision, recall)

    return score


def _lcs_length(first: Tokens, second: Tokens) -> int:
    """Longest common subsequence, bit-parallel (Allison-Dix / Hyyro).

    The O(n * m) table as n steps over m-bit integers: Python's big-int
    arithmetic does a row in C, so 2048 x 2048 tokens take milliseconds where
    a row-by-row loop over Python lists takes about a second. Bit j of `row` is
    1 while second[j] is not yet used by the LCS of the prefix seen so far.
    """
    row_mask = (1 << len(second)) - 1
    match_bits: dict[str, int] = {}
    for position, word in enumerate(second):
        match_bits[word] = match_bits.get(word, 0) | (1 << position)
    row = row_mask
    for word in first:
        matched = row & match_bits.get(word, 0)
        row = ((row + matched) | (row - matched)) & row_mask
    return len(second) - row.bit_count()


def _rouge_l(hypothesis: Tokens, reference: Tokens) -> float:
    common = _lcs_length(hypothesis, reference)
    return _f1(common / len(hypothesis), common / len(reference))


_WORD_METRICS: dict[str, Callable[[Tokens, Tokens], float]] = {
    "bleu": _bleu,
    "gleu": _gleu,
    "meteor": _meteor,
    **{f"rouge_{order}": _rouge_n(order) for order in range(1, 6)},
    "rouge_l": _rouge_l,
}


def similarity(metric: str, text: str, reference: str) -> float:
    """The `metric` score of `text` against `reference`, in [0, 1].

    Raises ValueError for a metric that is not in METRICS (`cosine` included:
    it is scored with an embeddings model, not here).
    """
    if metric == "fuzzy_match":
        return fuzz.ratio(text[:FUZZY_MAX_CHARS], reference[:FUZZY_MAX_CHARS]) / 100.0
    score = _WORD_METRICS.get(metric)
    if score is None:
        if metric == "cosine":
            raise ValueError("evaluation_metric 'cosine' needs an embeddings model; it is not a text metric")
        raise ValueError(f"unknown evaluation_metric {metric[:64]!r}; one of: {', '.join(METRICS)}")
    hypothesis, truth = tokenize(text), tokenize(reference)
    if not hypothesis or not truth:
        return 0.0
    return score(hypothesis, truth)
