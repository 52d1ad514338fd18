"""Text similarity: each metric's value on small sentences computed by hand, identity and
disjoint texts, symmetry where the definition has it, the empty-text rules and the caps."""

from __future__ import annotations

import math
import random

import pytest

from tuneforge.graders import similarity as sim
from tuneforge.graders.similarity import METRICS, similarity

WORD_METRICS = [metric for metric in METRICS if metric != "fuzzy_match"]
CAT = "The cat sat on the mat."
CAT_IS = "the cat is on the mat"


def test_the_metrics_are_openais_evaluation_metrics_but_cosine():
    assert METRICS == ("fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4",
                       "rouge_5", "rouge_l")
    with pytest.raises(ValueError, match="'cosine' needs an embeddings model"):
        similarity("cosine", "a", "a")
    with pytest.raises(ValueError, match="unknown evaluation_metric 'rouge_6'; one of: fuzzy_match, bleu"):
        similarity("rouge_6", "a", "a")


def test_tokens_are_lowercased_runs_of_letters_and_digits_of_any_script():
    assert sim.tokenize("Hello, World! it's_ok 3.14 Größe CAFÉ") == [
        "hello", "world", "it", "s", "ok", "3", "14", "größe", "café"]
    assert similarity("rouge_1", "Größe café", "größe CAFÉ!") == 1.0


def test_fuzzy_match_is_the_normalized_indel_similarity_of_the_raw_strings():
    # LCS(kitten, sitting) = "ittn" = 4; Indel distance 6 + 7 - 2 * 4 = 5; 1 - 5 / 13 = 8 / 13
    assert similarity("fuzzy_match", "kitten", "sitting") == pytest.approx(8 / 13)
    # case counts: LCS("Hello", "hello") = 4, distance 2 of 10
    assert similarity("fuzzy_match", "Hello", "hello") == pytest.approx(0.8)
    assert similarity("fuzzy_match", "", "") == 1.0
    assert similarity("fuzzy_match", "abc", "") == 0.0
    assert similarity("fuzzy_match", "abc", "xyz") == 0.0


def test_bleu_by_hand():
    # text and reference 6 tokens (BP = 1); clipped matches / text n-grams:
    #   1-grams: the x2, cat, on, mat = 5/6   2-grams: the cat, on the, the mat = 3/5
    #   3-grams: on the mat = 1/4             4-grams: none of 3 -> first zero order: 1 / (2^1 * 3) = 1/6
    #   BLEU = (5/6 * 3/5 * 1/4 * 1/6) ** (1/4) = (1/48) ** (1/4)
    assert similarity("bleu", CAT, CAT_IS) == pytest.approx((1 / 48) ** 0.25)
    # a b c d e / a b x d e: 4/5, 2/4, then two zero orders: 1 / (2 * 3) and 1 / (4 * 2)
    #   (4/5 * 1/2 * 1/6 * 1/8) ** (1/4) = (1/120) ** (1/4)
    assert similarity("bleu", "a b c d e", "a b x d e") == pytest.approx((1 / 120) ** 0.25)


def test_bleu_brevity_penalty_and_effective_order():
    # c = 2 < r = 6: BP = exp(1 - 6/2); only orders 1 and 2 exist in the text, both 1/1 and 1/1
    assert similarity("bleu", "the cat", CAT) == pytest.approx(math.exp(-2))
    # the other way: c = 6 >= r = 2; 2/6 (the clipped to 1), 1/5, then 1 / (2 * 4) and 1 / (4 * 3)
    assert similarity("bleu", CAT, "the cat") == pytest.approx((1 / 3 * 1 / 5 * 1 / 8 * 1 / 12) ** 0.25)
    # one word: effective order 1
    assert similarity("bleu", "cat", "cat") == 1.0
    # no word in common answers 0, not a smoothed precision
    assert similarity("bleu", "cat", "dog") == 0.0


def test_gleu_by_hand():
    # all 1..4-grams together: text 6 + 5 + 4 + 3 = 18, reference 18; matches 5 + 3 + 1 + 0 = 9
    #   min(9/18, 9/18) = 0.5
    assert similarity("gleu", CAT, CAT_IS) == pytest.approx(0.5)
    # the cat (3 n-grams) / the cat sat (6): 3 matches; min(3/3, 3/6) = 0.5, either way round
    assert similarity("gleu", "the cat", "the cat sat") == pytest.approx(0.5)
    assert similarity("gleu", "the cat sat", "the cat") == pytest.approx(0.5)


def test_meteor_by_hand():
    # aligned: the cat | on the mat -> m = 5 in 2 chunks; P = R = 5/6
    #   Fmean = P R / (0.9 P + 0.1 R) = 5/6; penalty = 0.5 * (2/5)^3 = 0.032; 5/6 * 0.968
    assert similarity("meteor", CAT, CAT_IS) == pytest.approx(5 / 6 * 0.968)
    # the cat / 6-token reference: m = 2, one chunk; P = 1, R = 1/3
    #   Fmean = (1/3) / (0.9 + 0.1/3) = 5/14; penalty = 0.5 * (1/2)^3 = 1/16; 5/14 * 15/16
    assert similarity("meteor", "the cat", CAT) == pytest.approx(75 / 224)
    # recall weighs more than precision: P = 1/3, R = 1: Fmean = (1/3) / (0.3 + 0.1) = 5/6; 5/6 * 15/16
    assert similarity("meteor", CAT, "the cat") == pytest.approx(75 / 96)


def test_meteor_alignment_keeps_chunks_together():
    # "the" could take either "the" of the reference: the one before "mat" makes one chunk
    #   m = 2, P = 1, R = 2/6: 5/14 * (1 - 0.5 * (1/2)^3) = 75/224, as for "the cat" above
    assert similarity("meteor", "the mat", CAT) == pytest.approx(75 / 224)
    # left to right finds a b | c (2 chunks); right to left finds a b c after the x (1 chunk)
    #   m = 3, P = 1, R = 1/2: Fmean = 0.5 / 0.95 = 10/19; penalty = 0.5 * (1/3)^3 = 1/54
    assert similarity("meteor", "a b c", "a b x a b c") == pytest.approx(10 / 19 * 53 / 54)


def test_rouge_n_by_hand():
    # rouge_2: bigrams 5 and 5, matches the cat, on the, the mat = 3: P = R = 3/5, F1 = 0.6
    assert similarity("rouge_2", CAT, CAT_IS) == pytest.approx(0.6)
    assert similarity("rouge_1", CAT, CAT_IS) == pytest.approx(5 / 6)
    assert similarity("rouge_3", CAT, CAT_IS) == pytest.approx(0.25)
    assert similarity("rouge_4", CAT, CAT_IS) == 0.0
    # the cat sat (2 bigrams) / CAT (5): 2 matches, P = 1, R = 2/5, F1 = 2 * 0.4 / 1.4 = 4/7
    assert similarity("rouge_2", "the cat sat", CAT) == pytest.approx(4 / 7)
    # a text shorter than n has no n-gram: 0, as rouge-score answers
    assert similarity("rouge_2", "hello", "hello") == 0.0


def test_rouge_l_by_hand():
    # LCS = the cat on the mat = 5: P = R = 5/6
    assert similarity("rouge_l", CAT, CAT_IS) == pytest.approx(5 / 6)
    # LCS(a b c d, b a d c) = 2: P = R = 1/2
    assert similarity("rouge_l", "a b c d", "b a d c") == pytest.approx(0.5)
    # LCS(the mat, CAT) = 2: P = 1, R = 1/3, F1 = (2/3) / (4/3) = 0.5
    assert similarity("rouge_l", "the mat", CAT) == pytest.approx(0.5)


@pytest.mark.parametrize("metric", METRICS)
def test_identity_scores_one(metric):
    text = "The quick brown fox jumps"
    # METEOR's fragmentation penalty never vanishes: one chunk of 5 costs 0.5 * (1/5)^3
    expected = 1 - 0.5 / 5**3 if metric == "meteor" else 1.0
    assert similarity(metric, text, text) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("metric", WORD_METRICS)
def test_disjoint_texts_score_zero(metric):
    assert similarity(metric, "The quick brown fox jumps", "lazy dogs sleep in every yard") == 0.0


@pytest.mark.parametrize("metric", WORD_METRICS)
def test_a_side_without_tokens_scores_zero(metric):
    assert similarity(metric, "", CAT) == 0.0
    assert similarity(metric, CAT, "") == 0.0
    assert similarity(metric, "", "") == 0.0
    assert similarity(metric, "?!...", "?!...") == 0.0


@pytest.mark.parametrize("metric", ["fuzzy_match", "gleu", "rouge_1", "rouge_2", "rouge_3", "rouge_l"])
def test_symmetric_metrics(metric):
    assert similarity(metric, "the cat sat", CAT) == pytest.approx(similarity(metric, CAT, "the cat sat"))


@pytest.mark.parametrize("metric", ["bleu", "meteor"])
def test_asymmetric_metrics(metric):
    assert similarity(metric, "the cat", CAT) != pytest.approx(similarity(metric, CAT, "the cat"))


def _words(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(["a", "b", "c", "d"]) for _ in range(count)]


@pytest.mark.parametrize("metric", METRICS)
def test_long_inputs_are_truncated_and_still_answer(metric):
    long_text = " ".join(_words(5000, seed=1))
    score = similarity(metric, long_text, " ".join(_words(5000, seed=2)))
    assert 0.0 < score < 1.0
    # METEOR: one chunk of the 2,048 tokens kept
    expected = 1 - 0.5 / sim.MAX_TOKENS**3 if metric == "meteor" else 1.0
    assert similarity(metric, long_text, long_text) == pytest.approx(expected, abs=1e-15)


def test_only_the_first_max_tokens_count():
    assert len(sim.tokenize(" ".join(_words(5000, seed=3)))) == sim.MAX_TOKENS == 2048
    head = " ".join(["a"] * sim.MAX_TOKENS)
    # the 2,952 tokens past the cap are never seen
    assert similarity("rouge_l", head + " b" * 2952, head) == 1.0
    assert similarity("bleu", head + " b" * 2952, head) == 1.0
    # characters are cut before tokenising: one 100,000-character token of a 200,000-character text
    assert sim.tokenize("x" * 200_000) == ["x" * sim.MAX_CHARS]
    assert similarity("fuzzy_match", "a" * 20_000 + "b" * 5000, "a" * 20_000) == 1.0


def test_the_bit_parallel_lcs_agrees_with_the_table():
    def table_lcs(first, second):
        previous = [0] * (len(second) + 1)
        for word in first:
            row = [0]
            for j, other in enumerate(second):
                row.append(previous[j] + 1 if word == other else max(previous[j + 1], row[j]))
            previous = row
        return previous[-1]

    rng = random.Random(7)
    for _ in range(200):
        first = _words(rng.randint(0, 30), seed=rng.randrange(10**9))
        second = _words(rng.randint(0, 30), seed=rng.randrange(10**9))
        assert sim._lcs_length(first, second) == table_lcs(first, second)
    assert sim._lcs_length(["a"] * 2048, ["a"] * 2048) == 2048
    assert sim._lcs_length(["a", "b"] * 1024, ["b"] * 2048) == 1024
