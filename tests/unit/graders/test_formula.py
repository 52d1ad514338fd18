"""The multi grader's formula: every feature and precedence rule by its value, and every error
by its exact message (what and at which column), at parse time and at evaluation."""

from __future__ import annotations

import pytest

from tuneforge.graders.formula import MAX_DEPTH, MAX_FORMULA_CHARS, MAX_TOKENS, FormulaError, parse

NAMES = ("a", "b", "name", "email")
VALUES = {"a": 3.0, "b": 0.5, "name": 1.0, "email": 0.5}


def value(formula: str, values: dict[str, float] | None = None) -> float:
    return parse(formula, NAMES).evaluate(VALUES if values is None else values)


def error(formula: str, names=NAMES) -> str:
    with pytest.raises(FormulaError) as raised:
        parse(formula, names)
    return str(raised.value)


def evaluation_error(formula: str, values: dict[str, float] | None = None) -> str:
    compiled = parse(formula, NAMES)
    with pytest.raises(FormulaError) as raised:
        compiled.evaluate(VALUES if values is None else values)
    return str(raised.value)


def test_openais_examples():
    assert value("(name + email) / 2") == 0.75
    assert value("min(a, b) * 0.5 + 0.5 * max(a, b)") == 1.75
    assert value("a ^ 2") == 9.0


@pytest.mark.parametrize(("formula", "expected"), [
    ("3", 3.0), ("0.25", 0.25), (".5", 0.5), ("2.", 2.0), ("1e-3", 0.001), ("2.5E+2", 250.0), ("1e2", 100.0),
])
def test_numbers(formula, expected):
    assert value(formula) == expected


@pytest.mark.parametrize(("formula", "expected"), [
    ("1 + 2 * 3", 7.0),          # * before +
    ("(1 + 2) * 3", 9.0),
    ("10 - 4 - 3", 3.0),         # left-associative
    ("16 / 4 / 2", 2.0),
    ("2 ^ 3 ^ 2", 512.0),        # right-associative: 2 ^ 9
    ("(2 ^ 3) ^ 2", 64.0),
    ("-a ^ 2", -9.0),            # the power before the sign: -(a^2)
    ("(-a) ^ 2", 9.0),
    ("2 ^ -1", 0.5),             # a signed exponent
    ("-2 ^ -2", -0.25),
    ("2 * -a ^ 2", -18.0),
    ("- -a", 3.0),
    ("+a", 3.0),
    ("-+-a", 3.0),
    ("2 * 3 ^ 2", 18.0),         # ^ before *
    ("a - b * 2 ^ 2 / 4", 2.5),
])
def test_precedence_and_associativity(formula, expected):
    assert value(formula) == expected


@pytest.mark.parametrize(("formula", "expected"), [
    ("min(a)", 3.0), ("max(b)", 0.5), ("min(a, b, 0.1)", 0.1), ("max(1, a, 2)", 3.0),
    ("abs(-2.5)", 2.5), ("floor(2.7)", 2.0), ("floor(-2.5)", -3.0), ("ceil(2.1)", 3.0),
    ("exp(0)", 1.0), ("sqrt(16)", 4.0), ("log(exp(2))", 2.0), ("max(min(a, 2), sqrt(b * 2))", 2.0),
])
def test_functions(formula, expected):
    assert value(formula) == pytest.approx(expected)


def test_whitespace_anywhere_and_names_it_uses():
    formula = parse(" \t( name\n+email ) /\t2 ", NAMES)
    assert formula.evaluate(VALUES) == 0.75
    assert formula.names == frozenset({"name", "email"})
    assert parse("3 * 2", NAMES).names == frozenset()


def test_a_sub_grader_may_share_a_functions_name():
    # a call is a name followed by "(": "max" alone is the sub-grader
    assert parse("max + max(max, 1)", ["max"]).evaluate({"max": 0.5}) == 1.5


@pytest.mark.parametrize(("formula", "message"), [
    ("a + x", "unknown variable 'x' at column 5; the sub-graders are: a, b, email, name"),
    ("foo(a)", "unknown function 'foo' at column 1; the functions are: min, max, abs, floor, ceil, exp, sqrt, log"),
    ("sqrt(a, b)", "sqrt() at column 1 takes exactly 1 argument, got 2"),
    ("2 * log()", "log() at column 5 takes exactly 1 argument, got 0"),
    ("min()", "min() at column 1 takes at least 1 argument, got 0"),
    ("(a + b", "expected ')' at column 7, found end of the formula"),
    ("max(a, b", "expected ')' at column 9, found end of the formula"),
    ("a + b)", "unexpected ')' at column 6; expected an operator"),
    ("a b", "unexpected name 'b' at column 3; expected an operator"),
    ("2a", "unexpected name 'a' at column 2; expected an operator"),
    ("1.5.2", "unexpected number '.2' at column 4; expected an operator"),
    ("a +", "unexpected end of the formula at column 4; expected a value"),
    ("* a", "unexpected '*' at column 1; expected a value"),
    ("()", "unexpected ')' at column 2; expected a value"),
    ("min(a,)", "unexpected ')' at column 7; expected a value"),
    ("a % b", "unexpected character '%' at column 3"),
    ("a == b", "unexpected character '=' at column 3"),
    ("1e", "malformed number at column 1"),
    ("2 * 1e+", "malformed number at column 5"),
    ("1e400", "the number at column 1 is too large"),
    ("", "the formula is empty"),
    (" \n ", "the formula is empty"),
])
def test_parse_errors_say_what_and_where(formula, message):
    assert error(formula) == message


def test_no_sub_graders_are_named_as_none():
    assert error("a", names=[]) == "unknown variable 'a' at column 1; the sub-graders are: (none)"


def test_length_bound():
    longest = "1" + " " * (MAX_FORMULA_CHARS - 1)
    assert value(longest) == 1.0
    assert error(longest + " ") == "the formula is 4097 characters long; at most 4096"


def test_token_bound():
    # "a" then 255 times "+a": 511 tokens; one more "+a" makes 513
    assert value("a" + "+a" * 255) == 3.0 * 256
    assert MAX_TOKENS == 512
    assert error("a" + "+a" * 256) == "the formula has more than 512 tokens (column 513)"


def test_nesting_bound():
    assert value("(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH) == 3.0
    assert value("abs(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH) == 3.0
    assert error("(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1)) == (
        "the formula nests deeper than 64 levels at column 65")
    assert error("min(" * 32 + "(" * 33 + "a" + ")" * 65) == "the formula nests deeper than 64 levels at column 161"


def test_long_sign_and_power_chains_parse_without_recursion():
    # 511 tokens of signs and carets; neither chain nests, so neither counts against the depth
    assert value("-" * 510 + "a") == 3.0
    assert value("1^" * 255 + "a") == 1.0
    assert value("2^" * 3 + "2") == 65536.0  # 2^(2^(2^2))


@pytest.mark.parametrize(("formula", "message"), [
    ("a / (b - 0.5)", "division by zero at column 3"),
    ("1 / 0", "division by zero at column 3"),
    ("sqrt(-a)", "sqrt() at column 1 has no finite real value for -3"),
    ("log(0)", "log() at column 1 has no finite real value for 0"),
    ("log(-1)", "log() at column 1 has no finite real value for -1"),
    ("exp(1000)", "exp() at column 1 has no finite real value for 1000"),
    ("10 ^ 1000", "10 ^ 1000 at column 4 has no finite real value"),
    ("(-8) ^ (1 / 3)", "-8 ^ 0.333333 at column 6 has no finite real value"),
    ("0 ^ -1", "0 ^ -1 at column 3 has no finite real value"),
    ("1e308 * 10", "the value at column 7 is too large (not a finite number)"),
    ("1e308 + 1e308", "the value at column 7 is too large (not a finite number)"),
])
def test_evaluation_errors_say_what_and_where(formula, message):
    assert evaluation_error(formula) == message


def test_a_huge_power_answers_at_once():
    assert evaluation_error("9 ^ 9 ^ 9") == "9 ^ 3.8742e+08 at column 3 has no finite real value"
    assert value("0.5 ^ 1e18") == 0.0


def test_scores_that_are_missing_or_not_numbers():
    assert evaluation_error("a + b", {"a": 1.0}) == "no score for the sub-grader 'b'"
    assert evaluation_error("a + b", {"a": 1.0, "b": "high"}) == "the score of 'b' is not a number"
    assert evaluation_error("a + b", {"a": 1.0, "b": float("nan")}) == "the score of 'b' is not a finite number"
    assert value("a + b", {"a": 1, "b": True}) == 2.0
