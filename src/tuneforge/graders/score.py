"""Scoring: one grader over a batch of (sample, item) pairs, with OpenAI's result shape.

`score_batch(grader, samples, items, tools)` answers one `GraderResult` per
pair: the reward, each sub-grader's score by name, OpenAI's error flags, the
time it took and the judge tokens it spent. A sub-grader that fails on a
sample scores 0 for it and sets its flag; nothing a sample or a grader holds
raises out of here (a reward function inside a training step must not stop
the step), except a grader this host cannot run at all (`GraderUnavailable`),
which `check` refuses before anything is scored.

What runs where: string checks, similarity metrics and formulas here, in the
caller's thread (bounded work); python graders in one sandbox process per
batch (`tools.python`, `graders/sandbox.py`), never in this process; model
graders through `tools.judge`, cosine similarity through `tools.embeddings`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from tuneforge.domain.graders import (
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    sub_graders,
)
from tuneforge.graders import formula, similarity, templates
from tuneforge.graders.templates import Sample, TemplateError

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
MAX_DETAILS_CHARS = 500
MAX_EMBEDDED_CHARS = 32_768  # of each text sent to the embeddings endpoint


class GraderUnavailable(Exception):
    """The grader needs what this host does not have (a sandbox, a judge, embeddings)."""


@dataclass
class ErrorFlags:
    """OpenAI's `metadata.errors`: which kinds of failure a result met."""

    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False

    def any(self) -> bool:
        return any(getattr(self, item.name) is True for item in fields(self))

    def merge(self, other: ErrorFlags) -> None:
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if theirs not in (None, False) and mine in (None, False):
                setattr(self, item.name, theirs)

    def as_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass
class GraderResult:
    reward: float
    sub_rewards: dict[str, float]
    errors: ErrorFlags
    execution_time_s: float = 0.0
    judge_tokens: dict[str, int] = field(default_factory=dict)  # model -> tokens spent judging this sample


@dataclass(frozen=True)
class JudgeReply:
    text: str
    tokens: int  # prompt and completion
    refused: bool = False
    completion_tokens: int = 0


class Judge(Protocol):
    """Where model graders are asked (`eval/judges.py` in a trainer, `services/serving/judges.py`
    in the control plane)."""

    def check(self, grader: Any, where: str) -> None:
        """Raises the API's 400 naming `{where}.<field>` when `grader`'s judge cannot be asked."""

    def complete_many(self, grader: Any, conversations: list[list[dict[str, str]]], *, sampling: Mapping[str, Any],
                      schema: Mapping[str, Any]) -> list[JudgeReply | JudgeError]:
        """The judge's answer to each conversation (side by side), or the error that answer met."""


class JudgeError(Exception):
    """The judge could not answer (its message is tenant-safe)."""


class Embeddings(Protocol):
    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text."""


class PythonBatch(Protocol):
    """A python grader's source in a sandbox process (`graders/sandbox.py`)."""

    def check(self) -> Any:
        """None when the source compiles and defines `grade`; else the outcome saying why not."""

    def grade_many(self, calls: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[Any]:
        """One outcome (score or error) per (sample, item)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class GradingTools:
    """What the graders that leave this process use; None where this host has none."""

    python: Callable[[str], PythonBatch] | None = None  # a sandbox for a python grader's source
    judge: Judge | None = None
    embeddings: Embeddings | None = None


@dataclass
class _Scores:
    """One sub-grader's scores over the batch: None where it failed, with that sample's flags."""

    values: list[float | None]
    errors: list[ErrorFlags]
    tokens: list[dict[str, int]]


def score_batch(grader: Any, samples: Sequence[Sample], items: Sequence[Mapping[str, Any]],
                tools: GradingTools) -> list[GraderResult]:
    """Every (sample, item) pair's result (see the module's docstring)."""
    started = time.perf_counter()
    by_name = {name: _sub_scores(sub, samples, items, tools) for name, sub in sub_graders(grader).items()}
    results = []
    for index in range(len(samples)):
        errors = ErrorFlags()
        tokens: dict[str, int] = {}
        sub_rewards: dict[str, float] = {}
        for name, scores in by_name.items():
            errors.merge(scores.errors[index])
            for model, spent in scores.tokens[index].items():
                tokens[model] = tokens.get(model, 0) + spent
            sub_rewards[name] = scores.values[index] or 0.0
        reward = _combine(grader, sub_rewards, errors) if isinstance(grader, MultiGrader) else \
            next(iter(sub_rewards.values()))
        results.append(GraderResult(reward, sub_rewards, errors, judge_tokens=tokens))
    elapsed_s = (time.perf_counter() - started) / max(1, len(samples))
    for result in results:
        result.execution_time_s = elapsed_s
    return results


def _combine(grader: MultiGrader, sub_rewards: dict[str, float], errors: ErrorFlags) -> float:
    try:
        return formula.parse(grader.calculate_output, grader.graders).evaluate(sub_rewards)
    except formula.FormulaError:
        errors.formula_parse_error = True
        return 0.0


def _sub_scores(grader: Any, samples: Sequence[Sample], items: Sequence[Mapping[str, Any]],
                tools: GradingTools) -> _Scores:
    if isinstance(grader, PythonGrader):
        return _python_scores(grader, samples, items, tools)
    if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        return _judged_scores(grader, samples, items, tools)
    scores = _Scores([], [], [{} for _ in samples])
    for sample, item in zip(samples, items):
        errors = ErrorFlags()
        try:
            value: float | None = _one(grader, sample, item, tools)
        except TemplateError as exc:
            value = None
            _template_failed(exc, sample, errors)
        except JudgeError as exc:
            value = None
            _judge_failed(exc, errors)
        except Exception:  # a metric's own failure on odd text: the sample's, never the step's
            value, errors.other_error = None, True
        scores.values.append(value)
        scores.errors.append(errors)
    return scores


def _template_failed(exc: TemplateError, sample: Sample, errors: ErrorFlags) -> None:
    if "output_json" in str(exc) and sample.output_json is None:
        errors.sample_parse_error = True
    else:
        errors.invalid_variable_error = True


def _judge_failed(exc: JudgeError, errors: ErrorFlags) -> None:
    errors.model_grader_server_error = True
    errors.model_grader_server_error_details = str(exc)[:MAX_DETAILS_CHARS]


def _one(grader: Any, sample: Sample, item: Mapping[str, Any], tools: GradingTools) -> float | None:
    if isinstance(grader, StringCheckGrader):
        return string_check(grader.operation, templates.render(grader.input, sample, item),
                            templates.render(grader.reference, sample, item))
    if isinstance(grader, TextSimilarityGrader):
        text = templates.render(grader.input, sample, item)
        reference = templates.render(grader.reference, sample, item)
        if grader.evaluation_metric == "cosine":
            return _cosine(text[:MAX_EMBEDDED_CHARS], reference[:MAX_EMBEDDED_CHARS], tools)
        return similarity.similarity(grader.evaluation_metric, text, reference)
    raise TypeError(f"no scorer for {type(grader).__name__}")


def string_check(operation: str, text: str, reference: str) -> float:
    if operation == "eq":
        return float(text == reference)
    if operation == "ne":
        return float(text != reference)
    if operation == "like":
        return float(reference in text)
    return float(reference.casefold() in text.casefold())  # ilike


def _cosine(text: str, reference: str, tools: GradingTools) -> float:
    if tools.embeddings is None:
        raise GraderUnavailable("cosine similarity needs an embeddings endpoint")
    first, second = tools.embeddings.embed([text, reference])
    if len(first) != len(second):
        raise JudgeError("the embeddings endpoint answered vectors of different lengths")
    norm = math.sqrt(sum(x * x for x in first)) * math.sqrt(sum(y * y for y in second))
    return 0.0 if norm == 0 else max(-1.0, min(1.0, sum(x * y for x, y in zip(first, second)) / norm))


def judge_schema(grader: ScoreModelGrader | LabelModelGrader) -> dict[str, Any]:
    """The JSON object a judge is asked to answer: {"result": a number, or one of the labels}."""
    if isinstance(grader, ScoreModelGrader):
        return {"type": "object", "properties": {"result": {"type": "number"}}, "required": ["result"]}
    return {"type": "object", "properties": {"result": {"type": "string", "enum": list(grader.labels)}},
            "required": ["result"]}


def _judged_scores(grader: ScoreModelGrader | LabelModelGrader, samples: Sequence[Sample],
                   items: Sequence[Mapping[str, Any]], tools: GradingTools) -> _Scores:
    """Every sample's judgement: the conversations rendered here, asked side by side (`complete_many`)."""
    if tools.judge is None:
        raise GraderUnavailable(f"{grader.type} graders need a judge model")
    scores = _Scores([None] * len(samples), [ErrorFlags() for _ in samples], [{} for _ in samples])
    asked: list[int] = []
    conversations = []
    for index, (sample, item) in enumerate(zip(samples, items)):
        try:
            conversations.append([{"role": message.role, "content": templates.render(message.text, sample, item)}
                                  for message in grader.input])
            asked.append(index)
        except TemplateError as exc:
            _template_failed(exc, sample, scores.errors[index])
    if not conversations:
        return scores
    sampling = grader.sampling_params.model_dump(exclude_none=True) if grader.sampling_params else {}
    replies = tools.judge.complete_many(grader, conversations, sampling=sampling, schema=judge_schema(grader))
    for index, reply in zip(asked, replies):
        if isinstance(reply, JudgeError):
            _judge_failed(reply, scores.errors[index])
            continue
        scores.tokens[index] = {grader.model: reply.tokens}
        scores.values[index] = _verdict(grader, reply, scores.errors[index])
    return scores


def _verdict(grader: ScoreModelGrader | LabelModelGrader, reply: JudgeReply, errors: ErrorFlags) -> float | None:
    if reply.refused:
        errors.model_grader_refusal_error = True
        return None
    answer = _judge_answer(reply.text)
    if isinstance(grader, LabelModelGrader):
        label = str(answer).strip() if answer is not None else ""
        if label not in grader.labels:
            errors.model_grader_parse_error = True
            return None
        return float(label in grader.passing_labels)
    number = _as_number(answer)
    low, high = grader.range
    if number is None or not low <= number <= high:
        errors.model_grader_parse_error = True
        return None
    return number


def _judge_answer(text: str) -> Any:
    parsed = templates.parse_json(text)
    if isinstance(parsed, dict) and "result" in parsed:
        return parsed["result"]
    return text[:1024]


def _as_number(answer: Any) -> float | None:
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        return float(answer) if math.isfinite(answer) else None
    match = _NUMBER.search(str(answer))
    return float(match.group(0)) if match else None


def _python_scores(grader: PythonGrader, samples: Sequence[Sample], items: Sequence[Mapping[str, Any]],
                   tools: GradingTools) -> _Scores:
    if tools.python is None:
        raise GraderUnavailable("python graders need a sandbox (bubblewrap) on this host")
    sandbox = tools.python(grader.source)
    try:
        outcomes = sandbox.grade_many([(sample.as_dict(), dict(item)) for sample, item in zip(samples, items)])
    finally:
        sandbox.close()
    scores = _Scores([], [], [{} for _ in samples])
    for outcome in outcomes:
        errors = ErrorFlags()
        if outcome.error == "sandbox_error":
            errors.python_grader_server_error = True
            errors.python_grader_server_error_type = "sandbox_error"
        elif outcome.error is not None:
            errors.python_grader_runtime_error = True
            errors.python_grader_runtime_error_details = (outcome.details or outcome.error)[:MAX_DETAILS_CHARS]
            errors.unresponsive_reward_error = outcome.error == "timeout"
        scores.values.append(None if outcome.error is not None else float(outcome.score))
        scores.errors.append(errors)
    return scores


def result_json(grader: Any, result: GraderResult, *, sampled_model: str | None = None) -> dict[str, Any]:
    """`POST /v1/fine_tuning/alpha/graders/run`'s answer, in OpenAI's shape."""
    return {
        "reward": result.reward,
        "sub_rewards": dict(result.sub_rewards) if isinstance(grader, MultiGrader) else {},
        "metadata": {
            "name": grader.name, "type": grader.type, "errors": result.errors.as_dict(),
            "execution_time": round(result.execution_time_s, 6), "scores": dict(result.sub_rewards),
            "token_usage": sum(result.judge_tokens.values()) if result.judge_tokens else None,
            "sampled_model_name": sampled_model,
        },
        "model_grader_token_usage_per_model": dict(result.judge_tokens),
    }
