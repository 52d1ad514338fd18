"""The scrubber every trainer-written text passes before a tenant reads it."""

from __future__ import annotations

import traceback

from tuneforge.domain.tenant_text import scrub, scrub_data


def _real_traceback() -> str:
    try:
        open("/nonexistent/dir/file.jsonl")
    except OSError:
        return traceback.format_exc()
    raise AssertionError("unreachable")


def test_a_traceback_loses_its_frames_and_paths_but_keeps_what_failed() -> None:
    text = "trainer error:\n" + _real_traceback()
    cleaned = scrub(text)
    assert "Traceback" not in cleaned and 'File "' not in cleaned and "/nonexistent" not in cleaned
    assert "FileNotFoundError" in cleaned and "<path>" in cleaned


def test_paths_and_object_reprs_go_urls_and_ratios_stay() -> None:
    cleaned = scrub("read /srv/tuneforge/objects/a.bin and C:\\Users\\op\\x.py via <foo.Bar object at 0xdeadbeef>; "
                    "see http://judge.example/v1/chat, 3/4 done, n/a")
    assert cleaned == ("read <path> and <path> via <object>; see http://judge.example/v1/chat, 3/4 done, n/a")


def test_a_flattened_traceback_is_scrubbed_too() -> None:
    cleaned = scrub('oops Traceback (most recent call last):  File "/a/b/c.py", line 3, in f  ValueError: x')
    assert "Traceback" not in cleaned and "/a/b" not in cleaned and "ValueError: x" in cleaned


def test_long_messages_are_cut_and_event_data_is_scrubbed_recursively() -> None:
    assert len(scrub("x" * 5000)) == 2000
    data = scrub_data({"traceback": "anything", "step": 3, "files": ["/var/lib/x/y.json"], "loss": 1.5})
    assert data == {"step": 3, "files": ["<path>"], "loss": 1.5}
