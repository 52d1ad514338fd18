"""A grader checked before anything is scored with it: a 400 naming the field, or nothing.

`parse(raw, prefix)` types a grader's JSON (pydantic, `domain/graders.py`);
`check(grader, tools, prefix)` then finds what the types cannot: a template
naming no namespace, a formula naming an unknown sub-grader, a python source
that does not compile or defines no `grade` (compiled inside the sandbox, not
here), a grader this host cannot run (no sandbox, no judge, no embeddings).
`item_fields(grader)` is what every dataset line must hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import TypeAdapter, ValidationError

from tuneforge.domain.errors import ApiError, from_validation_errors, invalid
from tuneforge.domain.graders import (
    GRADER_TYPES,
    Grader,
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    sub_graders,
)
from tuneforge.graders import formula, templates
from tuneforge.graders.score import GradingTools

_ADAPTER: TypeAdapter[Any] = TypeAdapter(Grader)


def parse(raw: Any, prefix: str) -> Any:
    """The typed grader of a request body's `prefix` field; a 400 naming the bad field otherwise."""
    if not isinstance(raw, dict):
        raise invalid(f"{prefix} must be a grader object", param=prefix)
    kind = raw.get("type")
    if kind not in GRADER_TYPES:
        raise invalid(f"{prefix}.type {kind!r} is not a grader type; use one of {', '.join(GRADER_TYPES)}",
                      param=f"{prefix}.type")
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        errors = [{**error, "loc": _without_tags(error["loc"])} for error in exc.errors()]
        raise from_validation_errors(errors, tuple(prefix.split("."))) from None


def _without_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic names the branch of a tagged union in an error's location: drop it."""
    return tuple(part for part in loc if part not in GRADER_TYPES)


def _texts(grader: Any) -> Iterator[tuple[str, str]]:
    """(field, template) for each text field of one (non-multi) grader."""
    if isinstance(grader, (StringCheckGrader, TextSimilarityGrader)):
        yield "input", grader.input
        yield "reference", grader.reference
    elif isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        for index, message in enumerate(grader.input):
            yield f"input.{index}.content", message.text


def _located(grader: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(grader, MultiGrader):
        for name, sub in grader.graders.items():
            yield f"{prefix}.graders.{name}", sub
    else:
        yield prefix, grader


def check(grader: Any, tools: GradingTools, prefix: str) -> None:
    """Refuse (400) what can be known wrong before scoring; see the module's docstring."""
    if isinstance(grader, MultiGrader):
        try:
            formula.parse(grader.calculate_output, grader.graders)
        except formula.FormulaError as exc:
            raise invalid(f"{prefix}.calculate_output: {exc}", param=f"{prefix}.calculate_output") from None
    for where, sub in _located(grader, prefix):
        for name, template in _texts(sub):
            problem = templates.check(template)
            if problem is not None:
                raise invalid(f"{where}.{name}: {problem}", param=f"{where}.{name}")
        _check_runnable(sub, tools, where)


def _check_runnable(grader: Any, tools: GradingTools, where: str) -> None:
    if isinstance(grader, TextSimilarityGrader) and grader.evaluation_metric == "cosine" and tools.embeddings is None:
        raise invalid(f"{where}.evaluation_metric: cosine similarity needs an embeddings endpoint, and the "
                      "operator has named none; use another metric", param=f"{where}.evaluation_metric")
    if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        if tools.judge is None:
            raise invalid(f"{where}.model: {grader.model!r}: this host asks no judges", param=f"{where}.model")
        tools.judge.check(grader, where)
    if isinstance(grader, PythonGrader):
        _check_python(grader, tools, where)


def _check_python(grader: PythonGrader, tools: GradingTools, where: str) -> None:
    if tools.python is None:
        raise invalid(f"{where}.source: python graders run only in a sandbox, and this host has none "
                      "(the operator must install bubblewrap)", param=f"{where}.source", code="sandbox_unavailable")
    sandbox = tools.python(grader.source)
    try:
        problem = sandbox.check()
    finally:
        sandbox.close()
    if problem is None:
        return
    if problem.error == "sandbox_error":
        raise ApiError(503, "the grader sandbox could not start; try again", "server_error",
                       f"{where}.source", "sandbox_error", retry_after=5)
    raise invalid(f"{where}.source: {problem.details or problem.error}", param=f"{where}.source")


def item_fields(grader: Any) -> set[str]:
    """The item fields the grader's templates read: every dataset line must hold each one."""
    names: set[str] = set()
    for sub in sub_graders(grader).values():
        for _, template in _texts(sub):
            names |= templates.item_fields(template)
    return names


def missing_fields(grader: Any, item: dict[str, Any]) -> list[str]:
    return sorted(name for name in item_fields(grader) if name not in item)
