"""The eval runner's handling of text: the tenant's task rows made readable by a tokenizer, and
the samples shown with the results made safe and bounded."""

from __future__ import annotations

import pytest

from tuneforge.data.errors import BadDataError
from tuneforge.train.eval_runner import MAX_SAMPLE_CHARS, Observation, TaskExample, samples, shown, task_examples


def test_task_rows_with_lone_surrogates_become_text_a_tokenizer_takes() -> None:
    rows = [{"messages": [{"role": "user", "content": "a\ud800\x07"}, {"role": "assistant", "content": "r\udfff"}]},
            {"prompt": "p\udc80", "completion": "c\ud811"}]
    chat, plain = task_examples(rows, 10)
    assert chat.prompt_messages == [{"role": "user", "content": "a\ufffd\x07"}]  # controls stay: the model reads them
    assert chat.reference == "r\ufffd" and (plain.prompt_text, plain.reference) == ("p\ufffd", "c\ufffd")
    for text in (chat.prompt_for_judge, chat.reference, plain.prompt_text, plain.reference):
        text.encode("utf-8")


def test_a_row_whose_messages_are_not_objects_is_bad_data_naming_the_line() -> None:
    with pytest.raises(BadDataError) as bad:
        task_examples([{"messages": ["hi", {"role": "assistant", "content": "x"}]}], 10)
    assert bad.value.line_number == 1


def test_samples_show_every_text_escaped_and_cut_and_at_most_five_per_suite() -> None:
    tasks = [TaskExample([{"role": "user", "content": "q\x00"}], None, "ref\x1b") for _ in range(8)]
    safety = [{"messages": [{"role": "user", "content": "harm\x85"}, {"role": "assistant", "content": "no"}]}] * 8
    base = Observation(safety_replies=["\x07"] * 8, task_answers=["b" * (MAX_SAMPLE_CHARS * 2)] * 8)
    tuned = Observation(safety_replies=["\ud800"] * 8, task_answers=["\x00\x7f"] * 8)
    shown_samples = samples(base, tuned, safety=safety, tasks=tasks)
    assert len(shown_samples["task"]) == 5 and len(shown_samples["safety"]) == 5
    assert shown_samples["task"][0]["prompt"] == "user: q\\u0000"
    assert shown_samples["task"][0]["reference"] == "ref\\u001b"
    assert shown_samples["task"][0]["fine_tuned"] == "\\u0000\\u007f"
    assert len(shown_samples["task"][0]["base"]) <= MAX_SAMPLE_CHARS
    assert shown_samples["task"][0]["base"].endswith("more characters cut]")
    assert shown_samples["safety"][0] == {"prompt": "harm\\u0085", "base": "\\u0007", "fine_tuned": "\ufffd"}
    assert shown("plain") == "plain"
