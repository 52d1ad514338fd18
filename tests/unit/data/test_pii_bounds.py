"""The PII scanner's work is linear in the text, whatever the text.

A tenant's text is adversarial: many matches, long digit clusters, separators the
phone and card patterns backtrack over. Two checks, neither a wall-clock threshold:
the overlap resolution gives what the obvious quadratic rule gives, and the scan's
cost grows like the text (scaling compared within one run), not like its square.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuneforge.data import pii
from tuneforge.data.pii import KINDS, PiiMatch

# Pieces that wake the scanner's patterns: digits and their separators, the
# international "+", an e-mail's "@", assignment keys, quotes, IPv6 colons.
_FRAGMENTS = ["0", "1", "7", "9", " ", "-", ".", "(", ")", "+", "+1 ", "212-555-0147 ", "(212) 555-0147",
              "01 23 45 67 89", "4111 1111 1111 1111", "a@b.co ", "@", "pass=", 'token: "', "'", "\"",
              "sk-", "xoxb-", "::", "1:2:", "GB82 WEST ", "AB 12 34 56 C", "192.168.", "x", "é", "\n"]

_SCALE = 8
# Linear work makes the 8x text cost ~8x; quadratic work ~64x. The margin absorbs a
# loaded CI machine's noise on the small text (fixed costs only lower the ratio).
_MAX_GROWTH = 24.0


def _quadratic_reference(found: list[PiiMatch]) -> list[PiiMatch]:
    """The rule as first written: most specific kind first, then earliest start."""
    priority = {kind: rank for rank, kind in enumerate(KINDS)}
    kept: list[PiiMatch] = []
    for match in sorted(found, key=lambda m: (priority[m.kind], m.start)):
        if all(match.end <= other.start or match.start >= other.end for other in kept):
            kept.append(match)
    return sorted(kept, key=lambda m: m.start)


_spans = st.builds(lambda kind, start, length: PiiMatch(kind, start, start + length),
                   st.sampled_from(KINDS), st.integers(0, 200), st.integers(1, 30))


@given(st.lists(_spans, max_size=60))
def test_overlaps_are_resolved_as_the_reference_rule(found: list[PiiMatch]) -> None:
    assert pii._without_overlaps(found) == _quadratic_reference(found)


def test_many_matches_resolve_in_linear_comparisons() -> None:
    phones = " ".join(f"212-555-{n:04d}" for n in range(2000))
    found = pii.scan(phones)
    assert len(found) == 2000
    assert all(match.kind == "phone" for match in found)


def _cpu_s(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        pii.scan(text)
        best = min(best, time.process_time() - started)
    return best


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_FRAGMENTS), min_size=1, max_size=12))
def test_scan_work_grows_linearly_with_adversarial_text(pieces: list[str]) -> None:
    unit = "".join(pieces)
    small = unit * max(1, 20_000 // len(unit))
    large = small * _SCALE
    small_s, large_s = _cpu_s(small), _cpu_s(large)
    # below a millisecond the clock's resolution decides the ratio, and that little work is bounded anyway
    if large_s > 0.001:
        assert large_s <= _MAX_GROWTH * max(small_s, 0.0005), (unit, small_s, large_s)


def test_a_long_phone_line_is_scanned_in_linear_work() -> None:
    unit = "(212) 555-0147 "
    small_s = _cpu_s(unit * 2_000)
    large_s = _cpu_s(unit * 2_000 * _SCALE)
    assert large_s <= _MAX_GROWTH * max(small_s, 0.0005)
