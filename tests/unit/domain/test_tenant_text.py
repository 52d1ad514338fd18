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


# ---- safe_text, bounded, safe_data: model and tenant text made safe to store and show ----------------

from tuneforge.domain.tenant_text import TRUNCATION_MARKER, bounded, safe_data, safe_text  # noqa: E402


def test_safe_text_escapes_nul_and_every_control_but_tab_newline_and_return() -> None:
    text = "a\x00b\x07c\x1b[31m\x7f\x85\x9f\t\n\r" + "".join(chr(c) for c in range(0x20, 0x7f))
    safe = safe_text(text)
    assert safe.startswith("a\\u0000b\\u0007c\\u001b[31m\\u007f\\u0085\\u009f\t\n\r")
    assert safe.endswith("".join(chr(c) for c in range(0x20, 0x7f)))  # printable ASCII untouched
    controls = [chr(c) for c in (*range(0x00, 0x20), *range(0x7f, 0xa0)) if chr(c) not in "\t\n\r"]
    assert len(controls) == 62 and not any(c in safe_text("".join(controls)) for c in controls)


def test_safe_text_replaces_lone_surrogates_and_keeps_real_characters() -> None:
    safe = safe_text("x\ud800y\udfffz é 😀 中文")
    assert safe == "x\ufffdy\ufffdz é 😀 中文"
    safe.encode("utf-8")  # the point: it now encodes (and so serialises as JSON and stores in PostgreSQL)


def test_safe_text_leaves_clean_text_as_the_same_object_and_maps_prefixes_to_prefixes() -> None:
    clean = "plain text\twith\nnewlines é"
    assert safe_text(clean) is clean
    text = "ab\x00cd\ud800ef\x1b"
    whole = safe_text(text)
    for end in range(len(text) + 1):  # a stream may hand out what it sanitised so far
        assert whole.startswith(safe_text(text[:end]))


def test_bounded_cuts_with_a_marker_that_counts_the_cut_and_never_passes_the_bound() -> None:
    assert bounded("short", 10) == "short"
    for length in (61, 100, 12_345):
        cut = bounded("x" * length, 60)
        kept = cut.count("x")  # the marker holds none
        assert len(cut) <= 60 and cut == "x" * kept + TRUNCATION_MARKER.format(cut_chars=length - kept)


def test_safe_data_walks_keys_lists_and_nested_objects_and_bounds_each_string() -> None:
    value = {"k\x00": ["\x01", 1, 2.5, None, True, {"deep": "\ud800" + "y" * 100}]}
    safe = safe_data(value, max_string_chars=40)
    assert list(safe) == ["k\\u0000"]
    first, one, two, none, true, nested = safe["k\\u0000"]
    assert (first, one, two, none, true) == ("\\u0001", 1, 2.5, None, True)
    assert nested["deep"].startswith("\ufffdyyy") and len(nested["deep"]) <= 40
    assert "more characters cut" in nested["deep"]


def test_scrub_makes_a_message_safe_as_well() -> None:
    assert scrub("bad byte \x00 in /srv/x/y.py") == "bad byte \\u0000 in <path>"
