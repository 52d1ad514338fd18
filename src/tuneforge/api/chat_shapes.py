"""The shapes a chat answer may be asked for: `response_format` (JSON mode, JSON schema) and
tool calls, and answers generated whole in those shapes (docs/openai-compat.md).

`json_object`: decoding is constrained to one JSON object (serve/constrained.py). `json_schema`
and a forced tool call: the same, then the object is checked against the schema; one that does
not match is drawn again (seed + 1000 * k), up to SCHEMA_ATTEMPTS times, before a 422."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import anyio

from tuneforge.domain.errors import ApiError, invalid
from tuneforge.serve import json_schema
from tuneforge.serve import tools as tool_calls
from tuneforge.serve.params import Completion, ModelTarget, Prompt, SamplingParams, Usage
from tuneforge.serve.tools import check_schema

SCHEMA_ATTEMPTS = 3  # json_schema: answers drawn before the request gives up
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Answer:
    completion: Completion
    content: str | None
    calls: list[dict]

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else self.completion.finish_reason


async def chat_choice(engine: Any, target: ModelTarget, prompt: Prompt, params: SamplingParams,
                      schema: dict | None, tools: tuple[dict, ...], choice: str) -> Answer:
    """One choice, whole: in the schema's shape when one is asked, its tool calls read back."""
    if schema is not None:
        completion = await schema_answer(engine, target, prompt, params, schema)
    else:
        completion = await engine.acomplete(target, prompt, params)
    if not tools:
        return Answer(completion, completion.text, [])
    if choice == "auto":
        content, calls = tool_calls.parse_calls(completion.text, tools)
        return Answer(completion, content, calls)
    return Answer(completion, None, tool_calls.forced_call(completion.text, choice))


def reply_message(answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.calls:
        message["tool_calls"] = answer.calls
    return message


def replayed(answers: list[Answer], head: dict[str, Any], include_usage: bool,
             logprobs: bool) -> Iterator[dict[str, Any]]:
    """Whole answers sent as a stream's chunks (with tools: a call is known once it is complete)."""
    extra = {"usage": None} if include_usage else {}
    for index, answer in enumerate(answers):
        # called only within this iteration, so `index` is the current one
        def event(delta: dict[str, Any], finish_reason: str | None = None, scores: tuple = ()) -> dict[str, Any]:
            shown = {"content": list(scores), "refusal": None} if logprobs and scores else None
            return head | {"choices": [{"index": index, "delta": delta, "logprobs": shown,  # noqa: B023
                                        "finish_reason": finish_reason}]} | extra

        yield event({"role": "assistant", "content": ""})
        if answer.content:
            yield event({"content": answer.content}, scores=answer.completion.logprobs)
        if answer.calls:
            yield event({"tool_calls": [{"index": number, **call} for number, call in enumerate(answer.calls)]})
        yield event({}, answer.finish_reason)
    if include_usage:
        yield head | {"choices": [], "usage": total_usage([answer.completion for answer in answers])}


def total_usage(completions: list[Completion]) -> dict[str, int]:
    """One prompt, `n` completions: the prompt counted once, every choice's tokens."""
    return Usage(completions[0].usage.prompt_tokens, sum(c.usage.completion_tokens for c in completions)).as_dict()


def wants_json(shape: dict | None) -> bool:
    return shape is not None and shape.get("type") in ("json_object", "json_schema")


def response_format(shape: dict | None, texts: list[str], stream: bool) -> dict | None:
    """Checks `response_format` (`texts`: the messages' texts); the JSON schema the answer must
    match, if one is given.

    `json_object`: decoding is constrained to one JSON object (serve/constrained.py). `json_schema`:
    the same, then the object is checked against the schema; one that does not match is drawn
    again (seed + 1000 * k), up to SCHEMA_ATTEMPTS times, before the request answers 422."""
    if shape is None:
        return None
    kind = shape.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if not any("json" in text.lower() for text in texts):
            raise invalid("'messages' must contain the word 'json' in some form, to use 'response_format' of type "
                          "'json_object'.", param="messages")
        return None
    if kind != "json_schema":
        raise invalid("response_format.type must be 'text', 'json_object' or 'json_schema'",
                      param="response_format.type")
    spec = shape.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not _SCHEMA_NAME.match(spec["name"]):
        raise invalid("response_format.json_schema needs a name of 1-64 letters, digits, '_' or '-'",
                      param="response_format.json_schema.name")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid("response_format.json_schema.schema must be a JSON Schema object",
                      param="response_format.json_schema.schema")
    check_schema(schema, "response_format.json_schema.schema")
    if stream:
        raise invalid("json_schema answers are checked against the schema before they are sent, so they cannot "
                      "be streamed; stream with json_object, or leave stream out", param="stream")
    return schema


async def check_answer_schema(schema: dict | None, tools: tuple[dict, ...], choice: str) -> None:
    """400 for a tool's parameters, or the schema answers will be checked against, that is not
    valid under its dialect's meta-schema (serve/json_schema.check_dialect): in one trip to a
    thread, before anything is generated, since that check costs far more than the bounds
    `check_schema` applies on the event loop."""
    checks = [(tool["function"]["parameters"], f"tools.{index}.function.parameters")
              for index, tool in enumerate(tools)]
    if schema is not None and choice in ("none", "auto"):  # a forced call's is a tool's own (or ours)
        checks.append((schema, "response_format.json_schema.schema"))
    if checks:
        await anyio.to_thread.run_sync(_check_dialects, checks)


def _check_dialects(checks: list[tuple[dict, str]]) -> None:
    for schema, param in checks:
        json_schema.check_dialect(schema, param)


async def schema_answer(engine: Any, target: ModelTarget, prompt: Prompt, params: SamplingParams,
                        schema: dict) -> Completion:
    """A completion whose JSON object matches `schema`, drawn again when one does not."""
    problems = []
    for attempt in range(SCHEMA_ATTEMPTS):
        seed = None if params.seed is None else params.seed + 1000 * attempt
        completion = await engine.acomplete(target, prompt, replace(params, seed=seed))
        # in a thread: checking one answer may take up to json_schema.MAX_VALIDATION_STEPS keywords
        problem = await anyio.to_thread.run_sync(_answer_problem, schema, completion)
        if problem is None:
            return completion
        problems.append(problem)
        if params.temperature == 0:
            break  # greedy: another draw is the same answer
    raise ApiError(422, f"The model's answers did not match the schema ({len(problems)} attempt(s)); the last: "
                        f"{problems[-1]}", param="response_format", code="response_format_unsatisfied")


def _answer_problem(schema: dict, completion: Completion) -> str | None:
    """Why the answer's text fails `schema` (None: it matches); 400 when checking it costs more
    than the bound on a schema's work."""
    try:
        instance = json.loads(completion.text)
    except ValueError:
        return f"not one whole JSON object (finish_reason {completion.finish_reason})"
    try:
        return json_schema.first_problem(schema, instance)
    except json_schema.SchemaRefused as refused:
        raise invalid(f"The answer could not be checked against the schema: {refused.reason}",
                      param="response_format", code=refused.code) from None


MAX_LEGACY_LOGPROBS = 5  # as OpenAI's completions endpoint


def legacy_logprobs(entries: tuple[dict, ...] | list[dict], offset: int) -> tuple[dict[str, Any], int]:
    """Token entries in the chat shape ({"token", "logprob", "top_logprobs"}) as the legacy
    completions' `logprobs`: tokens, token_logprobs, top_logprobs (the likeliest rivals and the
    token drawn, text -> log probability) and text_offset (each token's first character, the first
    at `offset`); and the offset after the last."""
    shown: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for entry in entries:
        top: dict[str, float] = {}
        for rival in entry["top_logprobs"]:  # two ids may read the same: the likelier one shows
            top[rival["token"]] = max(top.get(rival["token"], rival["logprob"]), rival["logprob"])
        top.setdefault(entry["token"], entry["logprob"])
        shown["tokens"].append(entry["token"])
        shown["token_logprobs"].append(entry["logprob"])
        shown["top_logprobs"].append(top)
        shown["text_offset"].append(offset)
        offset += len(entry["token"])
    return shown, offset

