"""Personal data and secrets in training text: find, redact, or reject.

What is detected (kind — rule):

- email — local@domain.tld;
- phone — international `+CC …` with 8–15 digits; North American numbers
  with separators, `(212) 555-0147` / `212-555-0147` (area and exchange
  codes start with 2–9); UK numbers `0…` of 10–11 digits in separated
  groups; French-style pairs `01 23 45 67 89`. Digit runs without
  separators (order ids, timestamps) and dates are not phone numbers;
- credit_card — 13–19 digits, ungrouped or grouped 4-4-4-4(-n) / 4-6-4(5) by
  one kind of separator (space or dash), starting with 2–6 (the card
  networks' ranges) and passing the Luhn check;
- ipv4 — four octets 0–255 without leading zeros, not part of a longer dotted
  run and not after `v`/`version` (software versions). Private and public
  addresses are reported; 0.0.0.0, loopback 127/8, 255.255.255.255 and
  netmasks (first octet 255) identify nobody and are not;
- ipv6 — what Python's `ipaddress` accepts (so clock times and MAC addresses
  are not), except the unspecified `::` and loopback `::1`;
- us_ssn — `AAA-GG-SSSS` with a valid area (not 000, 666 or 900–999), group
  (not 00) and serial (not 0000), minus the two famous published numbers;
- uk_nino — UK National Insurance number `AB 12 34 56 C`, with the prefix
  letter rules (no D F I Q U V, no O second, not BG GB KN NK NT TN ZZ);
- iban — ISO 13616 account numbers (country code, check digits, 11–30
  alphanumerics, grouped by 4 or not) passing the mod-97 check;
- aws_access_key (`AKIA…`/`ASIA…` + 16), github_token (`ghp_`/`gho_`/`ghu_`/
  `ghs_`/`ghr_` + 36, `github_pat_…`), openai_key (`sk-…`, 20+ characters
  with a digit), slack_token (`xox[baprs]-…`), google_api_key (`AIza` + 35),
  private_key (a whole `-----BEGIN … PRIVATE KEY-----` block);
- password / secret — `password=…`, `db_pwd: …`, `client_secret: …`,
  `api_key = "…"`, `"token": "…"`: only the value is reported, and only a
  real-looking one: at least 4 characters, not one repeated character, not a
  placeholder (`<…>`, `{…}`, `${VAR}`, `changeme`, `null`, …), not code
  (`getenv(…)`), and after a colon not an unquoted plain word (prose such as
  "password: choose a long one").

Speed: `re` scans at ~15 ns a character per pattern, so patterns never run
over whole texts. Cheap `str` tests come first (no `@`: no email; fewer than
four digits: no number-like kind; no secret prefix or keyword: no secret),
then each number-like pattern runs only on a window around a cluster of
digits (found with one regex scan), and every candidate is validated in Python
before it is reported. Overlapping matches go to the more specific kind
(the order of KINDS), in work linear in the matches.

Bounded work: every pattern that runs on a whole text has bounded repetition
per starting position (or, like `_ASSIGNMENT`'s values, consumes what it
scans), and the number-like ones run on windows; tests/unit/data/
test_pii_bounds.py fuzzes the scan with adversarial texts and checks that its
cost grows like the text. An upload's check (this scan included) also runs in
a worker process under a deadline (`data.isolation`).
"""

from __future__ import annotations

import dataclasses
import heapq
import ipaddress
import re
from bisect import bisect_right
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

from tuneforge.data.example import Example, Finding


class PiiMatch(NamedTuple):
    kind: str
    start: int
    end: int


class PiiPolicy(str, Enum):
    WARN = "warn"  # report, keep the text
    REDACT = "redact"  # report, replace each match with [REDACTED_<KIND>]
    REJECT = "reject"  # report; the caller drops the example with an error


# Most specific first: on overlapping matches the earlier kind wins.
KINDS = ("private_key", "aws_access_key", "github_token", "openai_key", "slack_token", "google_api_key",
         "password", "secret", "email", "credit_card", "iban", "us_ssn", "uk_nino", "ipv6", "ipv4", "phone")
_PRIORITY = {kind: rank for rank, kind in enumerate(KINDS)}

_DIGITS = "0123456789"
_SECRET_PREFIXES = ("AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "sk-", "xox", "AIza",
                    "-----BEGIN")
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "key")
_ANY_DIGIT = re.compile(r"[0-9]").search  # one C scan; most texts have no digit at all
_GATE_WORDS = _SECRET_WORDS + tuple(prefix.lower() for prefix in _SECRET_PREFIXES)  # a superset, case-blind
_CLUSTER_GAP = 8  # digits at most this far apart belong to one candidate ("GB82 WEST 1234" spans 7)
_DIGIT_MASK = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))  # digits -> "0", the rest -> " "
_DIGIT_CLUSTER = re.compile(rf"\d(?:\D{{0,{_CLUSTER_GAP - 1}}}\d){{3,}}")
_CONTEXT = 8  # characters kept around a cluster (a "+", "(", or an IBAN/NINO's letters)
_MAX_TOKEN = 40  # a window grows to the next whitespace, at most this much further
_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![\w-])")
# ungrouped, or grouped by one kind of separator: 4-4-4-4(-3) or 4-6-4/5 (Amex, Diners)
_CARD = re.compile(r"(?<![\d-])(?:\d{13,19}|\d{4}(?:([ -])\d{4}){2}\1\d{1,4}(?:\1\d{1,3})?|\d{4}([ -])\d{6}\2\d{4,5})"
                   r"(?!\d)")
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{1,4}){1,5}(?![\w-])"  # international
    r"|(?<![\w(+-])(?:\([2-9]\d{2}\) ?|[2-9]\d{2}[ .-])[2-9]\d{2}[ .-]\d{4}(?![\w-])"  # North American
    r"|(?<![\w+-])0\d{2,4}[ -]\d{3,4}[ -]?\d{3,4}(?![\w-])"  # UK
    r"|(?<![\w+-])0[1-9](?:[ .]\d{2}){4}(?![\w-])")  # French-style pairs
_IPV4 = re.compile(r"(?<![\w.])(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?!\.?\d|\w)")
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f:][0-9A-Fa-f:.]{2,44}(?![\w:.])")  # then ipaddress decides
_SSN = re.compile(r"(?<![\d-])(\d{3})-(\d{2})-(\d{4})(?![\d-])")
_NINO = re.compile(r"(?<![A-Za-z0-9])([A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]) ?\d{2} ?\d{2} ?\d{2} ?[A-D](?![A-Za-z0-9])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Za-z0-9])")
_SECRETS = (
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
                               r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|.*\Z)", re.S)),
    ("aws_access_key", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")),
    ("github_token", re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,244})"
                                r"(?![A-Za-z0-9_])")),
    ("openai_key", re.compile(r"(?<![\w-])sk-(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{20,}(?![\w-])")),
    ("slack_token", re.compile(r"(?<![\w-])xox[baprs]-[A-Za-z0-9-]{10,}(?![\w-])")),
    ("google_api_key", re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])")),
)
_ASSIGNMENT = re.compile(  # a key may be prefixed (db_password, client-secret) but not glued to a word (bypass)
    r"(?i)(?<![a-z0-9])(pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|access[_-]?key)[\"']?"
    r"[ \t]*([:=])[ \t]*(?:\"([^\"\n]*)\"|'([^'\n]*)'"
    # unquoted, and not the next key ("pwd: …", "user=bob"; base64 padding "YWJj= " is a value)
    r"|(?![A-Za-z_][\w-]*(?:[ \t]*:(?:[\s\"']|$)|=[^\s=]))([^\s,;\"'&]+))")
_PLACEHOLDERS = frozenset({"none", "null", "nil", "true", "false", "password", "passwd", "secret", "token",
                           "changeme", "redacted", "hidden", "example", "placeholder", "required", "optional",
                           "string", "undefined", "empty", "your_password", "yourpassword", "mypassword",
                           "your_api_key", "your-api-key", "api_key", "xxx", "todo", "tbd", "n/a"})
_PLACEHOLDER_SHAPE = re.compile(r"^(?:<.*>|\{.*\}|\$\{?\w+\}?|\[.*\]|%\(?\w*\)?s|\*+|\.+|(.)\1*)$", re.S)


def scan(text: str) -> list[PiiMatch]:
    """Every detected span, sorted by position, without overlaps."""
    if not text:
        return []
    found: list[PiiMatch] = []
    if "@" in text:
        found += _emails(text)
    if _contains_any(text, _SECRET_PREFIXES):
        found += _secret_tokens(text)
    # an assignment needs ':' or '=': prose that merely mentions a "key" or "token" skips the regex
    if ("=" in text or ":" in text) and _contains_any(text.lower(), _SECRET_WORDS):
        found += _assignments(text)
    has_digit = _ANY_DIGIT(text) is not None
    if has_digit:  # every number-like kind has a cluster of at least 4 digits
        found += _numbers(text)
    if text.count(":") >= 2 and (has_digit or "::" in text):
        found += [PiiMatch("ipv6", m.start(), m.end()) for m in _IPV6.finditer(text)
                  if m.group().count(":") >= 2 and _is_ipv6(m.group())]
    return _without_overlaps(found)


def may_contain_pii(text: str) -> bool:
    """The cheap tests `scan` runs before any pattern: False means `scan(text)`
    finds nothing (and the same for every piece of `text`)."""
    if "@" in text or "::" in text or _contains_any(text.lower(), _GATE_WORDS):
        return True
    digits = 0
    for digit in _DIGITS:
        digits += text.count(digit)
        if digits >= 4:
            return True
    return False


_ROW_SEPARATOR = "\n" * _CLUSTER_GAP  # no needle holds it; digits either side of it are never one cluster


def scan_candidates(texts: list[str]) -> list[bool]:
    """For each text, whether `scan` may find something in it: False means
    `scan(text)` is empty. The tests `scan` starts with, run once over the
    whole batch (a few `str.find` passes and one digit mask) instead of once
    per text: a needle's rare character is looked for first (memchr speed),
    and only texts holding it are tested for the needles themselves. A digit
    cluster is ruled out on a region that holds its window (so a test that
    fails there fails on the window too); the rest get `scan`'s own window and
    test. Non-ASCII texts are all candidates."""
    candidate = [not text.isascii() for text in texts]
    plain = [index for index, text in enumerate(texts) if text and not candidate[index]]
    if not plain:
        return candidate
    rows = [texts[index] for index in plain]
    joined = _ROW_SEPARATOR.join(rows)
    starts = [0]
    for text in rows[:-1]:
        starts.append(starts[-1] + len(text) + len(_ROW_SEPARATOR))
    hits = _rows_holding(joined, starts, "@")
    for needle in ("AKIA", "ASIA", "AIza", "xox"):
        hits |= _rows_holding(joined, starts, needle)
    for rare, needles in (("_", _SECRET_PREFIXES), ("-", _SECRET_PREFIXES)):
        hits |= {row for row in _rows_holding(joined, starts, rare) if _contains_any(rows[row], needles)}
    # an assignment or an IPv6 address needs ':' or '=': rare in prose, so those texts are tested one by one
    for row in _rows_holding(joined, starts, ":") | _rows_holding(joined, starts, "="):
        text = rows[row]
        if _contains_any(text.lower(), _SECRET_WORDS) or text.count(":") >= 2:
            hits.add(row)
    hits |= _rows_with_number_candidates(joined, starts, rows)
    for row in hits:
        candidate[plain[row]] = True
    return candidate


def _rows_holding(joined: str, starts: list[int], needle: str) -> set[int]:
    """Rows (texts joined at `starts`) that hold `needle`; one hit per row is enough."""
    found: set[int] = set()
    at = joined.find(needle)
    while at != -1:
        row = bisect_right(starts, at) - 1
        found.add(row)
        at = joined.find(needle, starts[row + 1]) if row + 1 < len(starts) else -1
    return found


_REACH = _CONTEXT + _MAX_TOKEN  # how far `_window` reaches past a cluster, at most


def _rows_with_number_candidates(joined: str, starts: list[int], rows: list[str]) -> set[int]:
    """Rows with a digit cluster whose window `_may_hold_number` (what `_numbers` runs patterns on)."""
    found: set[int] = set()
    mask = joined.encode("ascii").translate(_DIGIT_MASK)
    for first, last in _clusters_in_mask(mask):
        row = bisect_right(starts, first) - 1
        if row in found:
            continue
        offset = starts[row]
        text = rows[row]
        low, high = max(offset, first - _REACH), min(offset + len(text), last + 1 + _REACH)
        region = joined[low:high]
        if "." not in region and region.lower() == region and mask.count(b"0", low, high) < 8:
            continue  # the window lies inside the region: `_may_hold_number` is False on it
        start, end = _window(text, first - offset, last - offset)
        if _may_hold_number(text[start:end]):
            found.add(row)
    return found


def redact(text: str, matches: list[PiiMatch]) -> str:
    """`text` with each match replaced by [REDACTED_<KIND>] (matches as `scan` returns them)."""
    pieces: list[str] = []
    position = 0
    for match in sorted(matches, key=lambda m: m.start):
        if match.start < position:
            continue
        pieces += [text[position : match.start], f"[REDACTED_{match.kind.upper()}]"]
        position = match.end
    pieces.append(text[position:])
    return "".join(pieces)


def apply_policy(example: Example, policy: PiiPolicy | str, joined: str | None = None,
                 ) -> tuple[list[Finding], Example]:
    """Findings for every text field of `example` (kind `pii:<kind>`, detail: the
    field and span — never the matched text), and the example to keep: a
    redacted copy under `redact` when something was found, the example itself
    otherwise. `joined`: `example.joined_text()` when the caller has it."""
    policy = PiiPolicy(policy)
    # one scan of all fields joined by newlines (no pattern crosses a newline it
    # would not cross at a field's end): most examples stop here, and only those
    # with a match are scanned field by field to name where it is
    if not scan(example.joined_text() if joined is None else joined):
        return [], example
    matches = {path: found for path, text in _text_fields(example) if (found := scan(text))}
    findings = [Finding(line=example.line, kind=f"pii:{m.kind}", detail={"field": path, "start": m.start, "end": m.end})
                for path, found in matches.items() for m in found]
    if policy is not PiiPolicy.REDACT or not matches:
        return findings, example
    return findings, _map_texts(example, lambda path, text: redact(text, matches[path]) if path in matches else text)


def _text_fields(example: Example) -> list[tuple[str, str]]:
    """(field path, text) of every text field, named as `_map_texts` names them."""
    fields: list[tuple[str, str]] = []
    messages = [(f"messages[{i}]", m) for i, m in enumerate(example.messages or [])]
    messages += [(name, m) for name in ("chosen", "rejected") if (m := getattr(example, name)) is not None]
    for path, message in messages:
        content = message.get("content")
        if isinstance(content, str):
            fields.append((f"{path}.content", content))
        elif isinstance(content, list):
            fields += [(f"{path}.content[{j}].text", part["text"]) for j, part in enumerate(content)
                       if isinstance(part, dict) and isinstance(part.get("text"), str)]
    fields += [(name, value) for name in ("prompt", "completion", "text")
               if isinstance(value := getattr(example, name), str)]
    return fields


def _map_texts(example: Example, visit: Callable[[str, str], str]) -> Example:
    """A copy of `example` with `visit(field, text)` applied to every text field."""
    changes: dict[str, Any] = {}
    if example.messages is not None:
        changes["messages"] = [_map_message(f"messages[{i}]", message, visit)
                               for i, message in enumerate(example.messages)]
    for name in ("prompt", "completion", "text"):
        value = getattr(example, name)
        if isinstance(value, str):
            changes[name] = visit(name, value)
    for name in ("chosen", "rejected"):
        value = getattr(example, name)
        if value is not None:
            changes[name] = _map_message(name, value, visit)
    return dataclasses.replace(example, **changes)


def _map_message(path: str, message: dict[str, Any], visit: Callable[[str, str], str]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": visit(f"{path}.content", content)}
    if isinstance(content, list):  # OpenAI content parts: only text parts carry text
        parts = [{**part, "text": visit(f"{path}.content[{j}].text", part["text"])}
                 if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                 for j, part in enumerate(content)]
        return {**message, "content": parts}
    return message


def _secret_tokens(text: str) -> list[PiiMatch]:
    return [PiiMatch(kind, m.start(), m.end()) for kind, pattern in _SECRETS for m in pattern.finditer(text)]


def _assignments(text: str) -> list[PiiMatch]:
    found: list[PiiMatch] = []
    for m in _ASSIGNMENT.finditer(text):
        group = next(g for g in (3, 4, 5) if m.group(g) is not None)
        # an unquoted plain word after a colon or a spaced "=" is prose ("password: choose one", "password= then")
        spaced = m.group(2) == ":" or m.start(group) > m.end(2)
        prose = group == 5 and spaced and m.group(group).rstrip(".,;!?").isalpha()
        end = m.end(group) - (group == 5 and m.group(group)[-1] in ".,")  # a sentence's full stop is not in it
        if not prose and _is_real_secret(text[m.start(group) : end]):
            kind = "password" if m.group(1).lower().startswith(("pass", "pwd")) else "secret"
            found.append(PiiMatch(kind, m.start(group), end))
    return found


def _contains_any(text: str, needles: tuple[str, ...]) -> bool:
    for needle in needles:  # a plain loop: any() over a generator costs more than the searches here
        if needle in text:
            return True
    return False


def _emails(text: str) -> list[PiiMatch]:
    found = []
    at = text.find("@")
    while at != -1:
        start, end = _window(text, at, at)
        found += [PiiMatch("email", start + m.start(), start + m.end()) for m in _EMAIL.finditer(text[start:end])]
        at = text.find("@", end)
    return found


def _numbers(text: str) -> list[PiiMatch]:
    """Number-like kinds, looked for only in windows around clusters of at
    least four digits (found by one regex scan of the text)."""
    found: list[PiiMatch] = []
    for first, last in _digit_clusters(text):
        start, end = _window(text, first, last)
        if _may_hold_number(text[start:end]):
            found += _numbers_in(text, start, end)
    return found


def _digit_clusters(text: str) -> list[tuple[int, int]]:
    """(first, last) positions of each cluster of at least 4 digits, digits at
    most _CLUSTER_GAP apart. ASCII text: digit runs found by `bytes.find` on a
    digit mask (a C table lookup per byte, far cheaper than a regex scan)."""
    if not text.isascii():
        return [(m.start(), m.end() - 1) for m in _DIGIT_CLUSTER.finditer(text)]
    return _clusters_in_mask(text.encode("ascii").translate(_DIGIT_MASK))


def _clusters_in_mask(mask: bytes) -> list[tuple[int, int]]:
    """`_digit_clusters` of an ASCII text from its digit mask."""
    clusters: list[tuple[int, int]] = []
    first = last = -_CLUSTER_GAP - 1
    digits = 0
    at = mask.find(b"0")
    while at != -1:
        end = mask.find(b" ", at)
        end = len(mask) if end == -1 else end
        if at - last > _CLUSTER_GAP:
            if digits >= 4:
                clusters.append((first, last))
            first, digits = at, 0
        digits += end - at
        last = end - 1
        at = mask.find(b"0", end)
    if digits >= 4:
        clusters.append((first, last))
    return clusters


def _may_hold_number(window: str) -> bool:
    """False when no number-like kind fits: cards, phones and SSNs need 8+
    digits, an IPv4 address dots, a NINO or IBAN capital letters ("in 2024",
    "case 123456" stop here)."""
    if "." in window or window.lower() != window:
        return True
    digits = 0
    for digit in _DIGITS:
        digits += window.count(digit)
    return digits >= 8


def _numbers_in(text: str, start: int, end: int) -> list[PiiMatch]:
    window = text[start:end]
    spans = [card for m in _CARD.finditer(window) if (card := _card(m)) is not None]
    if "-" in window:
        spans += [PiiMatch("us_ssn", m.start(), m.end()) for m in _SSN.finditer(window) if _is_ssn(*m.groups())]
    if not window.islower():  # NINO and IBAN hold capital letters
        spans += [PiiMatch("uk_nino", m.start(), m.end()) for m in _NINO.finditer(window)
                  if m.group(1) not in {"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"}]
        spans += [PiiMatch("iban", m.start(), m.end()) for m in _IBAN.finditer(window) if _is_iban(m.group())]
    if "." in window:
        spans += [PiiMatch("ipv4", m.start(), m.end()) for m in _IPV4.finditer(window)
                  if _is_ipv4(m.groups()) and not _after_version_word(text, start + m.start())]
    spans += [PiiMatch("phone", m.start(), m.end()) for m in _PHONE.finditer(window) if _is_phone(m.group())]
    return [PiiMatch(kind, start + s, start + e) for kind, s, e in spans]


def _window(text: str, first: int, last: int) -> tuple[int, int]:
    """[first, last] with some context, grown to whitespace so that the
    patterns' look-arounds see what they would see in the whole text."""
    start, end = max(0, first - _CONTEXT), min(len(text), last + 1 + _CONTEXT)
    floor, ceiling = max(0, start - _MAX_TOKEN), min(len(text), end + _MAX_TOKEN)
    while start > floor and not text[start - 1].isspace():
        start -= 1
    while end < ceiling and not text[end].isspace():
        end += 1
    return start, end


def _without_overlaps(found: list[PiiMatch]) -> list[PiiMatch]:
    """The matches kept when overlapping ones go to the more specific kind (then
    the earlier start). Linear in the matches per kind: a text of 100k phone
    numbers must not cost 100k² comparisons (it once took a worker down)."""
    by_kind: dict[str, list[PiiMatch]] = {}
    for match in found:
        by_kind.setdefault(match.kind, []).append(match)
    kept: list[PiiMatch] = []  # sorted by start and disjoint, so sorted by end too
    for kind in sorted(by_kind, key=_PRIORITY.__getitem__):
        accepted = _disjoint_from(kept, sorted(by_kind[kind], key=_start_of))
        kept = list(heapq.merge(kept, accepted, key=_start_of))
    return kept


def _disjoint_from(kept: list[PiiMatch], candidates: list[PiiMatch]) -> list[PiiMatch]:
    """Candidates (sorted by start) that overlap neither `kept` nor an earlier accepted one."""
    accepted: list[PiiMatch] = []
    accepted_end = -1  # accepted spans are disjoint and sorted: the last one ends furthest
    position = 0  # into `kept`: the first span that ends after the candidate's start
    for match in candidates:
        if match.start < accepted_end:
            continue
        while position < len(kept) and kept[position].end <= match.start:
            position += 1
        if position < len(kept) and kept[position].start < match.end:
            continue
        accepted.append(match)
        accepted_end = match.end
    return accepted


def _start_of(match: PiiMatch) -> int:
    return match.start


def luhn_ok(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _card(match: re.Match[str]) -> PiiMatch | None:
    """The card in a candidate: all of it, or without a last short group that
    was only the next number in the text ("4111 1111 1111 1111 2 times")."""
    candidate = match.group()
    ends = [len(candidate)]
    separator = match.group(1)
    if separator and candidate.count(separator) == 4:
        ends.append(candidate.rfind(separator))
    for end in ends:
        digits = candidate[:end].replace(" ", "").replace("-", "")
        if 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits):
            return PiiMatch("credit_card", match.start(), match.start() + end)
    return None


def _is_ssn(area: str, group: str, serial: str) -> bool:
    if area in ("000", "666") or area >= "900" or group == "00" or serial == "0000":
        return False
    return f"{area}-{group}-{serial}" not in ("078-05-1120", "219-09-9999")


def _is_iban(candidate: str) -> bool:
    compact = candidate.replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


def _is_ipv4(octets: tuple[str, ...]) -> bool:
    if any(len(octet) > 1 and octet[0] == "0" for octet in octets):
        return False
    values = [int(octet) for octet in octets]
    return max(values) <= 255 and values[0] not in (0, 127, 255)


def _after_version_word(text: str, start: int) -> bool:
    before = text[max(0, start - 9) : start].lower().rstrip(" :")
    return before.endswith(("v", "version", "ver", "ver."))


def _is_ipv6(candidate: str) -> bool:
    try:
        address = ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return not (address.is_unspecified or address.is_loopback)


def _is_phone(candidate: str) -> bool:
    digits = sum(char.isdigit() for char in candidate)
    if candidate.startswith("+"):
        return 8 <= digits <= 15
    return 9 <= digits <= 11


def _is_real_secret(value: str) -> bool:
    value = value.strip()
    if len(value) < 4 or value.lower() in _PLACEHOLDERS or _PLACEHOLDER_SHAPE.match(value):
        return False
    return "(" not in value  # getenv("X"), input(), a call: code, not a secret
