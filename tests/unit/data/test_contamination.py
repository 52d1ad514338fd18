"""Contamination: verbatim eval items are caught whatever their case and
punctuation, a few shared 13-grams are not, the short-text policy, and
hashes that do not depend on the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuneforge.data.contamination import ContaminationIndex, word_hashes

EVAL = [
    "What is the capital of France? The capital of France is Paris, a city on the Seine in the north of the country.",
    "Which planet is the largest in our solar system by mass and by volume, and how many moons does it have today?",
]
SHORT_EVAL = "Name three primary colours used in classic painting"  # 8 words
UNRELATED = ("Bananas ripen faster when stored next to apples because of the ethylene gas that apples release "
             "into the surrounding air over time")


@pytest.fixture()
def index() -> ContaminationIndex:
    index = ContaminationIndex()
    # 23 and 22 words: 11 and 10 13-grams; the 8-word item is one whole-text hash
    assert index.add_source("trivia", EVAL + [SHORT_EVAL]) == 11 + 10 + 1
    return index


def test_verbatim_copy_is_flagged_with_full_overlap(index: ContaminationIndex) -> None:
    finding = index.check(7, EVAL[0])
    assert (finding.line, finding.kind, finding.detail) == (7, "contamination", {"overlap": 1.0, "source": "trivia"})


def test_case_punctuation_and_spacing_do_not_hide_a_copy(index: ContaminationIndex) -> None:
    disguised = ("WHAT is the capital of france?! the capital of France is -- Paris; a city on the\nSeine in the "
                 "north of the country…")
    assert index.check(1, disguised).detail == {"overlap": 1.0, "source": "trivia"}


def test_a_few_shared_13_grams_stay_below_the_threshold(index: ContaminationIndex) -> None:
    # 15 consecutive words of an eval item (3 of its 13-grams) inside 42 words (30 13-grams): overlap 0.1
    shared = " ".join(EVAL[0].split()[:15])
    text = f"{shared} {UNRELATED} and then some more words"
    assert len(text.split()) == 42
    assert index.check(1, text) is None
    assert index.check(1, text, threshold=0.1).detail == {"overlap": 0.1, "source": "trivia"}
    assert index.check(1, UNRELATED, threshold=0.0) is None  # nothing shared: no finding even at 0


def test_short_texts_are_compared_whole_from_eight_words(index: ContaminationIndex) -> None:
    assert index.check(1, "name three primary colours, used in classic painting!").detail["overlap"] == 1.0
    assert index.check(2, "Name three primary colours used in painting") is None  # 7 words: skipped
    assert index.check(3, "The capital of France is Paris, a city on the") is None  # part of a long item


def test_the_source_with_most_hits_is_named() -> None:
    index = ContaminationIndex()
    index.add_source("first", [EVAL[0]])
    index.add_source("second", [EVAL[0] + " " + UNRELATED])
    index.add_source("third", [UNRELATED])
    assert index.sources == ["first", "second", "third"]
    assert index.check(1, EVAL[0]).detail == {"overlap": 1.0, "source": "first"}  # a tie goes to the first
    assert index.check(2, UNRELATED).detail == {"overlap": 1.0, "source": "second"}  # also in "third": a tie
    assert index.check(3, EVAL[0] + " " + UNRELATED).detail == {"overlap": 1.0, "source": "second"}


def test_batch_check_matches_one_by_one(index: ContaminationIndex) -> None:
    texts = [EVAL[0], UNRELATED, EVAL[1].upper(), "", SHORT_EVAL, "too short", EVAL[1][:60]] * 700
    lines = list(range(1, len(texts) + 1))
    batch = index.check_batch(lines, texts)
    single = [finding for line, text in zip(lines, texts) if (finding := index.check(line, text))]
    assert [(f.line, f.detail) for f in batch] == [(f.line, f.detail) for f in single]
    assert len(batch) == 3 * 700


def test_non_latin_eval_items() -> None:
    index = ContaminationIndex()
    item = "Какая самая длинная река в Европе и через сколько стран она протекает до впадения в Каспийское море"
    index.add_source("ru", [item])
    assert index.check(1, item.upper() + "?!").detail["overlap"] == 1.0
    assert index.check(2, "Вопрос: " + item).detail["overlap"] == 0.8333  # 17 words + 1: 5 of its 6 13-grams


def test_empty_index_and_bad_sources() -> None:
    index = ContaminationIndex()
    assert index.check(1, EVAL[0]) is None
    index.add_source("a", [])
    with pytest.raises(ValueError, match="already registered"):
        index.add_source("a", EVAL)


def test_word_hashes_do_not_depend_on_the_process() -> None:
    text = "Hash seeds differ between processes, these hashes must not."
    code = ("from tuneforge.data.contamination import word_hashes; "
            f"print(word_hashes([{text!r}])[0].tolist())")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert outputs == {f"{word_hashes([text])[0].tolist()}\n"}
