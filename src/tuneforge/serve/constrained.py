"""JSON mode: decoding constrained so that the text is always the prefix of one JSON object.

At each step the candidates are tried in the order the request's sampling would pick them
(greedy: by logit; sampled: a draw without replacement from the tempered top-p distribution),
and the first whose text keeps the output a viable JSON prefix wins. End-of-sequence is allowed
only once the object is complete, and a complete object ends the generation. Once the tokens
left are about as many as the characters still needed to close the object (`closing`), only
tokens that shorten that need are taken, so the object is finished within `max_tokens`: a
string the model would have gone on with is closed, a missing value written as null.

`json_prefix` is the checker: a scanner of the JSON grammar (RFC 8259) that tells a text that
cannot begin a JSON value from one that can, and one that is a whole value.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from tuneforge.serve.params import SamplingParams

INVALID, PARTIAL, COMPLETE = "invalid", "partial", "complete"
_WHITESPACE = " \t\n\r"
_ESCAPES = '"\\/bfnrt'
_HEX = "0123456789abcdefABCDEF"
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_CANDIDATES = 64  # drawn per step before the rest of the vocabulary is tried in logit order


def json_prefix(text: str, *, object_only: bool = True) -> str:
    """INVALID, PARTIAL (a prefix of some JSON text) or COMPLETE (one whole value, then maybe
    whitespace). `object_only`: the value must be an object."""
    return _scan(text, object_only)[0]


def closing(text: str) -> str | None:
    """The shortest text that makes the viable prefix `text` one whole JSON object (None: it is
    not viable); a missing value is written as null."""
    verdict, stack, state, key, literal, number = _scan(text, True)
    if verdict == INVALID:
        return None
    if verdict == COMPLETE:
        return ""
    if not stack and state == "value":
        return "{}"
    after_string = ":null" if key else ""
    if state == "string":
        tail = '"' + after_string
    elif state == "escape":
        tail = 'n"' + after_string
    elif state == "unicode":
        tail = "0" * (4 - len(literal)) + '"' + after_string
    elif state == "colon":
        tail = ":null"
    elif state == "value":
        tail = "null"
    elif state == "key":
        tail = '"":null'
    elif state == "literal":
        tail = _LITERALS[literal[0]][len(literal):]
    elif state == "number":
        tail = "" if _number_complete(number) else "0"
    else:  # after a value, or where a container may end
        tail = ""
    return tail + "".join("}" if opened == "{" else "]" for opened in reversed(stack))


def _scan(text: str, object_only: bool) -> tuple[str, list[str], str, bool, str, str]:
    """The scanner behind json_prefix and closing: (verdict, open containers, state, reading a key,
    the literal or \\u digits so far, the number so far)."""
    stack: list[str] = []
    state, key = "value", False  # key: the string being read is an object's key
    literal, number = "", ""
    i = 0
    while i < len(text):
        ch = text[i]
        if state == "value":
            if ch in _WHITESPACE:
                pass
            elif object_only and not stack and ch != "{":
                return INVALID, stack, state, key, literal, number
            elif ch == "{":
                stack.append("{")
                state = "key_or_end"
            elif ch == "[":
                stack.append("[")
                state = "value_or_end"
            elif ch == '"':
                state, key = "string", False
            elif ch == "-" or ch.isdigit():
                state, number = "number", ch
            elif ch in _LITERALS:
                state, literal = "literal", ch
            else:
                return INVALID, stack, state, key, literal, number
        elif state in ("key_or_end", "key"):
            if ch in _WHITESPACE:
                pass
            elif ch == '"':
                state, key = "string", True
            elif ch == "}" and state == "key_or_end":
                stack.pop()
                state = "after"
            else:
                return INVALID, stack, state, key, literal, number
        elif state == "value_or_end":
            if ch in _WHITESPACE:
                pass
            elif ch == "]":
                stack.pop()
                state = "after"
            else:
                state = "value"
                continue  # the same character, read as a value
        elif state == "colon":
            if ch == ":":
                state = "value"
            elif ch not in _WHITESPACE:
                return INVALID, stack, state, key, literal, number
        elif state == "after":
            if ch in _WHITESPACE:
                pass
            elif not stack:
                return INVALID, stack, state, key, literal, number  # something after the one value
            elif ch == ",":
                state = "key" if stack[-1] == "{" else "value"
            elif (ch == "}" and stack[-1] == "{") or (ch == "]" and stack[-1] == "["):
                stack.pop()
            else:
                return INVALID, stack, state, key, literal, number
        elif state == "string":
            if ch == "\\":
                state = "escape"
            elif ch == '"':
                state = "colon" if key else "after"
            elif ord(ch) < 0x20:
                return INVALID, stack, state, key, literal, number
        elif state == "escape":
            if ch == "u":
                state, literal = "unicode", ""
            elif ch in _ESCAPES:
                state = "string"
            else:
                return INVALID, stack, state, key, literal, number
        elif state == "unicode":
            if ch not in _HEX:
                return INVALID, stack, state, key, literal, number
            literal += ch
            if len(literal) == 4:
                state = "string"
        elif state == "literal":
            word = _LITERALS[literal[0]]
            literal += ch
            if not word.startswith(literal):
                return INVALID, stack, state, key, literal, number
            if literal == word:
                state = "after"
        elif state == "number":
            if _number_prefix(number + ch):
                number += ch
            elif _number_complete(number):
                state = "after"
                continue  # the number ended; the character belongs to what follows
            else:
                return INVALID, stack, state, key, literal, number
        i += 1
    if state == "after" and not stack:
        return COMPLETE, stack, state, key, literal, number
    if state == "number" and not stack and _number_complete(number):
        return COMPLETE, stack, state, key, literal, number
    return PARTIAL, stack, state, key, literal, number


def _number_prefix(text: str) -> bool:
    """Whether `text` can begin a JSON number: it is one, or one digit more makes it one (every
    unfinished number, '-', '1.', '1e+', lacks exactly a digit)."""
    return bool(_NUMBER.fullmatch(text) or _NUMBER.fullmatch(text + "0"))


def _number_complete(text: str) -> bool:
    return bool(text) and _number_prefix(text) and text[-1].isdigit()


class JsonConstraint:
    """Picks each next token so that the decoded output stays a viable JSON object."""

    def __init__(self, tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.ids: list[int] = []
        self.complete = False

    def pick(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int | None:
        """The next token, or None when nothing can follow (the object is complete, or no token of
        the vocabulary keeps the output viable)."""
        if self.complete:
            return None
        # Near the end of the budget, each token must bring the object nearer to whole: the
        # object is then finished within the budget, however long the model would have gone on.
        need = closing(self.tokenizer.decode(self.ids, skip_special_tokens=True)) or ""
        urgent = params.max_new_tokens - len(self.ids) <= len(need) + 1
        for token_id in self._candidates(logits, params, generator):
            if token_id in self.eos_ids:
                continue  # an unfinished object may not end
            text = self.tokenizer.decode(self.ids + [token_id], skip_special_tokens=True)
            if urgent:
                after = closing(text)
                if after is None or len(after) >= len(need):
                    continue
            if not text.strip():
                continue
            if text.endswith("\ufffd"):  # half a character: fine inside a string (only there can one stand)
                if json_prefix(text[:-1] + "\u00e9") != INVALID:
                    self.ids.append(token_id)
                    return token_id
                continue
            verdict = json_prefix(text)
            if verdict != INVALID:
                self.ids.append(token_id)
                self.complete = verdict == COMPLETE and text.rstrip().endswith("}")
                return token_id
        return None

    def _candidates(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        logits = logits.float()
        if params.temperature > 0:
            probs = torch.softmax(logits / params.temperature, dim=-1)
            if params.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                keep = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) < params.top_p
                probs = torch.zeros_like(probs).scatter(0, order, sorted_probs * keep)
            count = min(_CANDIDATES, int((probs > 0).sum()))
            drawn = torch.multinomial(probs, count, replacement=False, generator=generator).tolist()
            yield from drawn
            tried = set(drawn)
        else:
            tried = set()
        for token_id in torch.argsort(logits, descending=True).tolist():
            if token_id not in tried:
                yield token_id
