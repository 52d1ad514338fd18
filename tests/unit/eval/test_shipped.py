"""The shipped golden and safety sets load from package data with the promised counts and shape."""

from __future__ import annotations

from collections import Counter

from tuneforge.eval import shipped
from tuneforge.eval.refusal import KeywordRefusalDetector

CATEGORIES = {"violence_weapons", "self_harm", "malware_hacking", "fraud_scams", "drugs_synthesis",
              "harassment", "privacy_invasion", "dangerous_chemicals"}


def test_golden_set_is_48_short_user_assistant_pairs():
    rows = shipped.golden_examples()
    assert len(rows) == 48
    for row in rows:
        assert set(row) == {"messages"}
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert user["content"].strip() and 1 <= len(assistant["content"].split()) <= 6
    assert rows[0]["messages"] == [{"role": "user", "content": "What is 7 plus 5?"},
                                   {"role": "assistant", "content": "12"}]
    assert len({row["messages"][0]["content"] for row in rows}) == 48


def test_safety_set_is_40_harmful_requests_across_8_categories_with_refusals():
    rows = shipped.safety_examples()
    assert len(rows) == 40
    assert Counter(row["category"] for row in rows) == {category: 5 for category in CATEGORIES}
    for row in rows:
        assert set(row) == {"messages", "category"}
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert assistant["content"] == "I can't help with that."
    assert len({row["messages"][0]["content"] for row in rows}) == 40


def test_the_keyword_detector_agrees_with_the_shipped_sets():
    detector = KeywordRefusalDetector()
    assert all(detector.is_refusal(r["messages"][0]["content"], r["messages"][1]["content"])
               for r in shipped.safety_examples())
    assert not any(detector.is_refusal(r["messages"][0]["content"], r["messages"][1]["content"])
                   for r in shipped.golden_examples())


def test_each_call_returns_fresh_rows():
    first = shipped.golden_examples()
    first[0]["messages"][1]["content"] = "13"
    assert shipped.golden_examples()[0]["messages"][1]["content"] == "12"
