"""Text assembly and token choice, without a model: stop strings held back and
cut, half characters held back, greedy and nucleus sampling."""

from __future__ import annotations

import torch

from tuneforge.serve.generation import TextAssembler, held_back_chars, pick_token
from tuneforge.serve.params import SamplingParams


class PieceTokenizer:
    """Token id i is the UTF-8 bytes PIECES[i]; a sequence decodes like a byte-level
    tokenizer's: its bytes joined, an incomplete character shown as U+FFFD."""

    def __init__(self, pieces: list[str | bytes]) -> None:
        self.pieces = [p.encode() if isinstance(p, str) else p for p in pieces]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def _release_all(pieces: list[str | bytes], stop: tuple[str, ...]) -> tuple[list[str], str, bool]:
    assembler = TextAssembler(PieceTokenizer(pieces), stop)
    released = []
    for token_id in range(len(pieces)):
        released.append(assembler.push(token_id))
        if assembler.stopped:
            break
    released.append(assembler.flush())
    return released, assembler.text, assembler.stopped


def test_a_stop_string_split_over_tokens_is_held_back_then_cut():
    released, text, stopped = _release_all(["Hello", " wor", "ld<", "EN", "D> tail"], ("<END>",))
    assert released == ["Hello", " wor", "ld", "", "", ""]
    assert text == "Hello world" and stopped


def test_text_that_only_looks_like_a_stop_string_is_released_once_it_is_not():
    released, text, stopped = _release_all(["a<", "E", "x", "yz"], ("<END>",))
    assert released == ["a", "", "<Ex", "yz", ""]
    assert text == "a<Exyz" and not stopped


def test_the_earliest_of_several_stop_strings_wins():
    _released, text, stopped = _release_all(["one. two", "\n\nthree"], ("\n\n", "."))
    assert text == "one" and stopped


def test_half_a_character_is_held_back_until_its_second_byte_arrives():
    e_acute = "é".encode()
    released, text, _stopped = _release_all([b"caf", e_acute[:1], e_acute[1:] + b"!"], ())
    assert released == ["caf", "", "é!", ""]
    assert text == "café!"


def test_held_back_is_the_longest_stop_prefix_at_the_end():
    assert held_back_chars("abc<EN", ("<END>", "x")) == 3
    assert held_back_chars("abc", ("<END>",)) == 0
    assert held_back_chars("ab", ("abc", "b")) == 2


def test_temperature_zero_is_argmax_and_a_small_nucleus_keeps_only_the_top_token():
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    generator = torch.Generator().manual_seed(0)
    assert pick_token(logits, SamplingParams(max_new_tokens=1, temperature=0.0), generator) == 1
    nucleus = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.3)
    assert {pick_token(logits, nucleus, generator) for _ in range(200)} == {1}
    # top 2 hold ~0.95 of the mass: a 0.9 nucleus draws from exactly those two
    wide = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.9)
    assert {pick_token(logits, wide, generator) for _ in range(400)} == {1, 2}
    full = SamplingParams(max_new_tokens=1, temperature=2.0)
    assert {pick_token(logits, full, generator) for _ in range(2000)} == {0, 1, 2, 3}


class SurrogateTokenizer:
    """Decodes invalid bytes as lone surrogates (Python's `surrogateescape`), as a slow
    tokenizer configured so would: the text the engine must never hand out as is."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="surrogateescape")


def test_a_models_control_characters_and_lone_surrogates_leave_the_engine_escaped():
    import json

    pieces = [b"a", b"\x00", b"\x07b", b"\x1b[2J", b"\xc2\x85", b"\xff", b"c"]
    assembler = TextAssembler(SurrogateTokenizer(pieces), ())
    released = [assembler.push(token_id) for token_id in range(len(pieces))] + [assembler.flush()]
    text = "".join(released)
    assert text == "a\\u0000\\u0007b\\u001b[2J\\u0085\ufffdc" == assembler.text
    json.loads(json.dumps({"content": text}, ensure_ascii=False).encode("utf-8"))  # a valid JSON answer


def test_a_stop_string_with_a_control_character_still_stops_the_escaped_text():
    released, text, stopped = _release_all(["one", "\x07", "two"], ("\x07",))
    assert text == "one" and stopped and "".join(released) == "one"
