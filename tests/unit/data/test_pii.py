"""PII: every kind found in context with its exact span, the look-alikes that
must not match, redaction output, and the warn / redact / reject policies."""

from __future__ import annotations

import pytest

from tuneforge.data.example import Example
from tuneforge.data.pii import PiiMatch, PiiPolicy, apply_policy, luhn_ok, redact, scan

GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
GOOGLE_KEY = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx3\n-----END RSA PRIVATE KEY-----"


def found(text: str) -> list[tuple[str, str]]:
    """(kind, matched text) in order; also checks each span points at that text."""
    matches = scan(text)
    assert matches == sorted(matches, key=lambda m: m.start)
    return [(m.kind, text[m.start : m.end]) for m in matches]


@pytest.mark.parametrize(("text", "expected"), [
    ("Write to jane.doe+news@mail.example.co.uk, or to ADMIN@Example.org.",
     [("email", "jane.doe+news@mail.example.co.uk"), ("email", "ADMIN@Example.org")]),
    ("Call +1 (212) 555-0147 today", [("phone", "+1 (212) 555-0147")]),
    ("US office: 212-555-0147 or (415) 555 0199.", [("phone", "212-555-0147"), ("phone", "(415) 555 0199")]),
    ("London +44 20 7946 0958, locally 020 7946 0958", [("phone", "+44 20 7946 0958"), ("phone", "020 7946 0958")]),
    ("Paris: 01 23 45 67 89", [("phone", "01 23 45 67 89")]),
    ("Visa 4111 1111 1111 1111 and 4111-1111-1111-1111 and 4111111111111111.",
     [("credit_card", "4111 1111 1111 1111"), ("credit_card", "4111-1111-1111-1111"),
      ("credit_card", "4111111111111111")]),
    ("Amex 3782 822463 10005 expires soon", [("credit_card", "3782 822463 10005")]),
    ("Charge 4111 1111 1111 1111 2 times", [("credit_card", "4111 1111 1111 1111")]),
    ("hosts 192.168.1.10, 10.0.0.7 and 8.8.8.8.",
     [("ipv4", "192.168.1.10"), ("ipv4", "10.0.0.7"), ("ipv4", "8.8.8.8")]),
    ("v6 at 2001:db8::8a2e:370:7334 and fe80::1ff:fe23:4567:890a",
     [("ipv6", "2001:db8::8a2e:370:7334"), ("ipv6", "fe80::1ff:fe23:4567:890a")]),
    ("SSN 123-45-6789 on file", [("us_ssn", "123-45-6789")]),
    ("NI number AB 12 34 56 C or AB123456C.", [("uk_nino", "AB 12 34 56 C"), ("uk_nino", "AB123456C")]),
    ("IBAN GB82 WEST 1234 5698 7654 32 or DE89370400440532013000",
     [("iban", "GB82 WEST 1234 5698 7654 32"), ("iban", "DE89370400440532013000")]),
    ("key AKIAIOSFODNN7EXAMPLE and ASIAY34FZKBOKMUTVV7A", [("aws_access_key", "AKIAIOSFODNN7EXAMPLE"),
                                                          ("aws_access_key", "ASIAY34FZKBOKMUTVV7A")]),
    (f"token {GITHUB_TOKEN} and github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
     [("github_token", GITHUB_TOKEN), ("github_token", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop")]),
    ("OPENAI_API_KEY sk-proj-abc123def456ghi789jkl0", [("openai_key", "sk-proj-abc123def456ghi789jkl0")]),
    ("slack xoxb-123456789012-abcdefghijkl ok", [("slack_token", "xoxb-123456789012-abcdefghijkl")]),
    (f"maps {GOOGLE_KEY} ok", [("google_api_key", GOOGLE_KEY)]),
    (f"key:\n{PRIVATE_KEY}\ndone", [("private_key", PRIVATE_KEY)]),
    ("password=hunter22 and db_pwd: 'Tr0ub4dor&3'", [("password", "hunter22"), ("password", "Tr0ub4dor&3")]),
    ('{"client_secret": "abcd1234efgh", "api_key": "k-9f8e7d6c"}',
     [("secret", "abcd1234efgh"), ("secret", "k-9f8e7d6c")]),
    ("token=YWJjZGVmZ2g= then", [("secret", "YWJjZGVmZ2g=")]),
])
def test_each_kind_is_found_with_its_span(text: str, expected: list[tuple[str, str]]) -> None:
    assert found(text) == expected


@pytest.mark.parametrize("text", [
    "Card 4111 1111 1111 1112 fails the Luhn check",
    "Order 20240115123456, invoice 1234567890, ticket #99812345",
    "Dates: 2024-01-15, 15/01/2024, 01.15.2024, at 10:30:45",
    "Version 1.2.3, v2.10.4.1, version 10.0.19045.2 and python 3.11.7",
    "Local 127.0.0.1, any 0.0.0.0, mask 255.255.255.0, bad 256.1.1.1 and 01.02.03.04",
    "Loopback ::1, unspecified ::, MAC 00:1A:2B:3C:4D:5E, std::vector<int>, 12:30:00",
    "SSNs 000-12-3456, 666-12-3456, 912-34-5678, 123-00-4567, 123-45-0000, 078-05-1120",
    "NI QQ 12 34 56 C and GB123456A are not valid numbers",
    "IBAN GB82 WEST 1234 5698 7654 33 has a bad check",
    "password= \nnext line, password=, password: choose a long one, pwd = ****",
    'api_key = "<your key here>", secret: ${SECRET}, token=changeme, password: null',
    "bypass=12345 and passport: 123456789, the key: value is here",
    "task-abcdefghijklmnopqrstuvwxyz1 and sk-short1",
    "",
])
def test_look_alikes_are_not_reported(text: str) -> None:
    assert found(text) == []


def test_overlaps_go_to_the_more_specific_kind() -> None:
    assert found("password=4111111111111111") == [("password", "4111111111111111")]
    assert found("mail bob@192.168.1.10.example.com") == [("email", "bob@192.168.1.10.example.com")]


def test_luhn() -> None:
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")


def test_redact_replaces_each_match_with_its_kind() -> None:
    text = "Mail a@b.io, call +1 212 555 0147, card 4111 1111 1111 1111, password=hunter22."
    assert redact(text, scan(text)) == ("Mail [REDACTED_EMAIL], call [REDACTED_PHONE], card [REDACTED_CREDIT_CARD], "
                                        "password=[REDACTED_PASSWORD].")
    assert redact("nothing here", []) == "nothing here"
    assert redact("abcdef", [PiiMatch("email", 2, 4), PiiMatch("phone", 3, 5)]) == "ab[REDACTED_EMAIL]ef"


def chat_example() -> Example:
    return Example(line=3, kind="chat", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "I am at 8.8.4.4"}, {"type": "image_url"}]},
        {"role": "assistant", "content": "Mail me: x@y.org", "weight": 1},
    ])


def test_warn_reports_and_keeps_the_example() -> None:
    example = chat_example()
    findings, kept = apply_policy(example, "warn")
    assert kept is example
    assert [(f.line, f.kind, f.detail) for f in findings] == [
        (3, "pii:ipv4", {"field": "messages[1].content[0].text", "start": 8, "end": 15}),
        (3, "pii:email", {"field": "messages[2].content", "start": 9, "end": 16}),
    ]


def test_redact_returns_a_redacted_copy_of_every_text_field() -> None:
    example = chat_example()
    findings, redacted = apply_policy(example, PiiPolicy.REDACT)
    assert len(findings) == 2
    assert redacted.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "I am at [REDACTED_IPV4]"}, {"type": "image_url"}]},
        {"role": "assistant", "content": "Mail me: [REDACTED_EMAIL]", "weight": 1},
    ]
    assert example.messages[2]["content"] == "Mail me: x@y.org"  # the original is untouched

    preference = Example(line=1, kind="preference", messages=[{"role": "user", "content": "SSN?"}],
                         chosen={"role": "assistant", "content": "123-45-6789"},
                         rejected={"role": "assistant", "content": "No."})
    _, redacted = apply_policy(preference, "redact")
    assert (redacted.chosen, redacted.rejected) == ({"role": "assistant", "content": "[REDACTED_US_SSN]"},
                                                    {"role": "assistant", "content": "No."})
    instruction = Example(line=1, kind="instruction", prompt="From a@b.io", completion="To c@d.io")
    _, redacted = apply_policy(instruction, "redact")
    assert (redacted.prompt, redacted.completion) == ("From [REDACTED_EMAIL]", "To [REDACTED_EMAIL]")
    text = Example(line=1, kind="text", text="AKIAIOSFODNN7EXAMPLE")
    assert apply_policy(text, "redact")[1].text == "[REDACTED_AWS_ACCESS_KEY]"


def test_reject_reports_and_clean_examples_pass_through() -> None:
    example = chat_example()
    findings, kept = apply_policy(example, "reject")
    assert [f.kind for f in findings] == ["pii:ipv4", "pii:email"] and kept is example
    clean = Example(line=1, kind="text", text="Nothing personal here.")
    assert apply_policy(clean, "redact") == ([], clean)
    with pytest.raises(ValueError):
        apply_policy(clean, "ignore")


def _gate_corpus() -> list[str]:
    """Texts that hit every test the scan starts with, texts that nearly do, and noise around them."""
    import random

    rng = random.Random(7)
    pieces = ["jane@example.com", "+44 20 7946 0958", "4111 1111 1111 1111", "192.168.1.10", "2001:db8::1",
              "123-45-6789", "AB 12 34 56 C", "GB82 WEST 1234 5698 7654 32", "AKIAIOSFODNN7EXAMPLE", GITHUB_TOKEN,
              "sk-proj-abc123def456ghi789jkl0", "xoxb-123456789012-abcdefghijkl", GOOGLE_KEY, PRIVATE_KEY,
              "password=hunter22", "token: 'abcd1234'", "case 123456", "in 2024", "v1.2.3.4", "12:30:00",
              "order 20240115123456", "a:b:c", "key", "token", "=", ":", "@", "::", "1234", "12 34", "Case 1234.",
              "naïve 1234 5678", "٣٤٥٦٧", "１２３４", "digits 9 8 7 6 5 4 3 2", "x" * 45 + "12345678", "sk-", "xox"]
    texts = list(pieces)
    words = ["the", "model", "reads", "(case", "ok", "A", "b.", "\n", "x", "-", "(", ")", "?"]
    for _ in range(3000):
        parts = [rng.choice(words) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5:
            parts.insert(rng.randint(0, len(parts)), rng.choice(pieces))
        if rng.random() < 0.3:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        texts.append(rng.choice([" ", "", "\n"]).join(parts))
    return texts


def test_batch_gate_never_hides_what_the_scan_finds() -> None:
    from tuneforge.data.pii import scan_candidates

    texts = _gate_corpus()
    for start in range(0, len(texts), 97):  # batches of several sizes and neighbours
        batch = texts[start : start + 1 + start % 300]
        gate = scan_candidates(batch)
        assert len(gate) == len(batch)
        for text, candidate in zip(batch, gate):
            if not candidate:
                assert scan(text) == [], text
    # and it does rule texts out: a gate that passes everything would prove nothing
    plain = ["the model reads every line (case 123456)?", "You are a helpful assistant.", "", "in 2024 ok"]
    assert scan_candidates(plain) == [False, False, False, False]
    assert scan_candidates(["the model", "mail jane@example.com", "ok"]) == [False, True, False]
