"""The `multi` grader's `calculate_output`: a formula over its sub-graders' scores.

`parse(formula, names)` checks a tenant's formula once and gives a `Formula`,
whose `evaluate(values)` computes it for one sample's scores. The formula is
parsed by hand (a tokenizer and a recursive-descent parser), never handed to
Python's `eval`, `compile` or `ast`, and compiled to a postfix program that a
loop runs, so neither parsing nor evaluation recurses beyond the nesting bound.

Grammar (whitespace anywhere between tokens):

    expression := term (("+" | "-") term)*
    term       := power (("*" | "/") power)*
    power      := ("+" | "-")* primary ("^" power)?
    primary    := number | name | function "(" expression ("," expression)* ")"
                | "(" expression ")"

`^` is the power, right-associative and tighter than a sign, as in
mathematics: `-a^2` is `-(a^2)`, `2^3^2` is `2^(3^2)`, `a^-1` is `1/a`.
Numbers: `3`, `0.5`, `.5`, `1e-3`. A name is a sub-grader (`names`), or a
function when a `(` follows: min and max (one argument or more), abs, floor,
ceil, exp, sqrt, log (natural; one argument each).

Bounds: `MAX_FORMULA_CHARS` characters, `MAX_TOKENS` tokens, `MAX_DEPTH`
nested parentheses or calls. Every error is a `FormulaError` that says what
and where (a 1-based column); at evaluation, so are division by zero, a
square root or logarithm out of its domain and a result that is not finite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

MAX_FORMULA_CHARS = 4096
MAX_TOKENS = 512
MAX_DEPTH = 64

# name -> (the function, fewest arguments, most arguments or None for any number)
_FUNCTIONS: dict[str, tuple[Callable[..., float], int, int | None]] = {
    "min": (min, 1, None),
    "max": (max, 1, None),
    "abs": (abs, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 1),
}

# `1.`, `.5` and `1e-3` are numbers; `1e` (a dangling exponent) is caught as malformed.
_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BAD_EXPONENT = re.compile(r"[eE][+-]?(?![0-9])")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYMBOLS = frozenset("+-*/^(),")


class FormulaError(ValueError):
    """A formula that does not parse, or cannot be computed for these scores."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "number", "name", one of _SYMBOLS, or "end"
    text: str
    column: int


def _tokenize(formula: str) -> list[_Token]:
    if len(formula) > MAX_FORMULA_CHARS:
        raise FormulaError(f"the formula is {len(formula)} characters long; at most {MAX_FORMULA_CHARS}")
    tokens: list[_Token] = []
    position = 0
    while position < len(formula):
        char = formula[position]
        if char.isspace():
            position += 1
            continue
        if len(tokens) == MAX_TOKENS:
            raise FormulaError(f"the formula has more than {MAX_TOKENS} tokens (column {position + 1})")
        number = _NUMBER.match(formula, position)
        name = _NAME.match(formula, position)
        if number:
            if _BAD_EXPONENT.match(formula, number.end()):
                raise FormulaError(f"malformed number at column {position + 1}")
            tokens.append(_Token("number", number.group(), position + 1))
            position = number.end()
        elif name:
            tokens.append(_Token("name", name.group(), position + 1))
            position = name.end()
        elif char in _SYMBOLS:
            tokens.append(_Token(char, char, position + 1))
            position += 1
        else:
            raise FormulaError(f"unexpected character {char!r} at column {position + 1}")
    tokens.append(_Token("end", "", len(formula) + 1))
    return tokens


# A postfix program: ("push", value, column), ("load", name, column), ("negate", column),
# ("binary", operator, column), ("call", function, argument count, column); the column (of the
# token it came from) is for the messages of errors at evaluation.
_Instruction = tuple


class _Parser:
    def __init__(self, tokens: list[_Token], names: Collection[str]) -> None:
        self._tokens = tokens
        self._index = 0
        self._names = names
        self._depth = 0
        self.program: list[_Instruction] = []
        self.used_names: set[str] = set()

    def _peek(self) -> _Token:
        return self._tokens[self._index]

    def _advance(self) -> _Token:
        token = self._tokens[self._index]
        self._index += 1
        return token

    def _expect(self, kind: str) -> _Token:
        token = self._peek()
        if token.kind != kind:
            raise FormulaError(f"expected {kind!r} at column {token.column}, found {_describe(token)}")
        return self._advance()

    def parse(self) -> None:
        self._expression()
        token = self._peek()
        if token.kind != "end":
            raise FormulaError(f"unexpected {_describe(token)} at column {token.column}; expected an operator")

    def _expression(self) -> None:
        self._term()
        while self._peek().kind in ("+", "-"):
            operator = self._advance()
            self._term()
            self.program.append(("binary", operator.kind, operator.column))

    def _term(self) -> None:
        self._power()
        while self._peek().kind in ("*", "/"):
            operator = self._advance()
            self._power()
            self.program.append(("binary", operator.kind, operator.column))

    def _power(self) -> None:
        # Iterative rather than recursive on `^`, so a long chain costs no stack: the operands
        # are pushed left to right, then folded from the right, each with its own signs.
        negations: list[int | None] = []  # per operand: the column of its sign when negated
        carets: list[int] = []
        while True:
            negated, sign_column = False, 0
            while self._peek().kind in ("+", "-"):
                sign = self._advance()
                negated ^= sign.kind == "-"
                sign_column = sign_column or sign.column
            self._primary()
            negations.append(sign_column if negated else None)
            if self._peek().kind != "^":
                break
            carets.append(self._advance().column)
        for level in range(len(negations) - 1, -1, -1):
            if level < len(carets):
                self.program.append(("binary", "^", carets[level]))
            if negations[level] is not None:
                self.program.append(("negate", negations[level]))

    def _primary(self) -> None:
        token = self._advance()
        if token.kind == "number":
            value = float(token.text)
            if not math.isfinite(value):
                raise FormulaError(f"the number at column {token.column} is too large")
            self.program.append(("push", value, token.column))
        elif token.kind == "name" and self._peek().kind == "(":
            self._call(token)
        elif token.kind == "name":
            if token.text not in self._names:
                known = ", ".join(sorted(self._names)) or "(none)"
                raise FormulaError(
                    f"unknown variable {token.text!r} at column {token.column}; the sub-graders are: {known}"
                )
            self.used_names.add(token.text)
            self.program.append(("load", token.text, token.column))
        elif token.kind == "(":
            self._nest(token)
            self._expression()
            self._expect(")")
            self._depth -= 1
        else:
            raise FormulaError(f"unexpected {_describe(token)} at column {token.column}; expected a value")

    def _call(self, name: _Token) -> None:
        if name.text not in _FUNCTIONS:
            known = ", ".join(_FUNCTIONS)
            raise FormulaError(f"unknown function {name.text!r} at column {name.column}; the functions are: {known}")
        self._nest(self._advance())
        arguments = 0
        if self._peek().kind != ")":
            self._expression()
            arguments = 1
        while arguments and self._peek().kind == ",":
            self._advance()
            self._expression()
            arguments += 1
        self._expect(")")
        self._depth -= 1
        _, fewest, most = _FUNCTIONS[name.text]
        if arguments < fewest or (most is not None and arguments > most):
            wanted = f"exactly {fewest}" if most == fewest else f"at least {fewest}"
            plural = "" if fewest == 1 else "s"
            raise FormulaError(
                f"{name.text}() at column {name.column} takes {wanted} argument{plural}, got {arguments}"
            )
        self.program.append(("call", name.text, arguments, name.column))

    def _nest(self, opening: _Token) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise FormulaError(f"the formula nests deeper than {MAX_DEPTH} levels at column {opening.column}")


def _describe(token: _Token) -> str:
    if token.kind == "end":
        return "end of the formula"
    if token.kind in ("number", "name"):
        return f"{token.kind} {token.text!r}"
    return repr(token.text)


def _apply_binary(operator: str, left: float, right: float, column: int) -> float:
    try:
        if operator == "+":
            return left + right
        if operator == "-":
            return left - right
        if operator == "*":
            return left * right
        if operator == "/":
            return left / right
        # math.pow, not **: a negative base with a fractional exponent raises instead of
        # giving a complex number, and a huge result raises OverflowError instead of hanging.
        return math.pow(left, right)
    except ZeroDivisionError:
        raise FormulaError(f"division by zero at column {column}") from None
    except (OverflowError, ValueError):
        raise FormulaError(f"{left:g} {operator} {right:g} at column {column} has no finite real value") from None


@dataclass(frozen=True)
class Formula:
    """A parsed formula; `names` are the sub-graders it reads."""

    source: str
    names: frozenset[str]
    _program: tuple[_Instruction, ...] = field(repr=False)

    def evaluate(self, values: Mapping[str, float]) -> float:
        stack: list[float] = []
        for instruction in self._program:
            kind, column = instruction[0], instruction[-1]
            if kind == "push":
                result = instruction[1]
            elif kind == "load":
                result = _load(values, instruction[1])
            elif kind == "negate":
                result = -stack.pop()
            elif kind == "binary":
                right = stack.pop()
                result = _apply_binary(instruction[1], stack.pop(), right, column)
            else:
                result = _call(instruction[1], stack, instruction[2], column)
            if not math.isfinite(result):
                raise FormulaError(f"the value at column {column} is too large (not a finite number)")
            stack.append(result)
        return stack[0]


def _load(values: Mapping[str, float], name: str) -> float:
    if name not in values:
        raise FormulaError(f"no score for the sub-grader {name!r}")
    try:
        value = float(values[name])
    except (TypeError, ValueError):
        raise FormulaError(f"the score of {name!r} is not a number") from None
    if not math.isfinite(value):
        raise FormulaError(f"the score of {name!r} is not a finite number")
    return value


def _call(name: str, stack: list[float], arguments: int, column: int) -> float:
    function, _, most = _FUNCTIONS[name]
    operands = stack[-arguments:]
    del stack[-arguments:]
    try:
        # min and max take the list (min(x) of one float would try to iterate it)
        return float(function(operands) if most is None else function(*operands))
    except (OverflowError, ValueError):
        raise FormulaError(f"{name}() at column {column} has no finite real value for {operands[0]:g}") from None


def parse(formula: str, names: Collection[str]) -> Formula:
    """Check `formula` against the sub-graders `names`; FormulaError says what is wrong and where."""
    tokens = _tokenize(formula)
    if tokens[0].kind == "end":
        raise FormulaError("the formula is empty")
    parser = _Parser(tokens, frozenset(names))
    parser.parse()
    return Formula(source=formula, names=frozenset(parser.used_names), _program=tuple(parser.program))
