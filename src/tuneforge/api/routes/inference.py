"""/v1/chat/completions and /v1/completions — OpenAI's inference API on base models
and the calling tenant's fine-tuned models.

Bodies follow OpenAI's fields. Parameters tuneforge cannot honour (several
choices, log probabilities, penalties, tools) answer 400 naming the parameter
rather than being silently ignored; a few that change nothing here (`user`,
`metadata`, `store`, `service_tier`) are accepted. `stream: true` answers with
Server-Sent Events, one chunk per piece of text as it is generated, then
`data: [DONE]`. Which model answers (a route's pick, the built-in engine or a vLLM
server) is `api/dispatch.py`'s; this module turns the bodies into prompts and
sampling and the engine's output into OpenAI's answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from tuneforge.api import chat_shapes as shapes
from tuneforge.api import deps, dispatch, sse
from tuneforge.api.limits import (
    MAX_GENERATED_TOKENS,
    MAX_ID_CHARS,
    MAX_LIST_ITEMS,
    MAX_MESSAGES,
    MAX_NAME_CHARS,
    Int64,
)
from tuneforge.api.openapi import error_responses, event_stream
from tuneforge.api.schemas.base import ObjectRoute
from tuneforge.api.schemas.inference import (
    ChatCompletion,
    ChatCompletionChunk,
    TextCompletion,
    TextCompletionChunk,
)
from tuneforge.db import Session
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import ApiError, invalid
from tuneforge.serve import tools as tool_calls
from tuneforge.serve.params import Chunk, ModelTarget, Prompt, SamplingParams, Usage
from tuneforge.serve.sinks import Sink
from tuneforge.services.context import Platform

router = APIRouter(prefix="/v1", tags=["inference"], route_class=ObjectRoute)
_log = logging.getLogger(__name__)

MAX_STOP_SEQUENCES = 4  # as OpenAI
MAX_CHOICES = 8  # n: choices per request, generated one after another
MAX_TOP_LOGPROBS = 20  # as OpenAI
MAX_TOP_K = 100_000
TENANT = Depends(deps.tenant)
PLATFORM = Depends(deps.platform)
_STREAMED = "The answer; with stream=true, Server-Sent Events: its chunks, then `data: [DONE]`."


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = Field(False, description="Send a last chunk with the usage of the whole request.")


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Checked by hand (`_message_text`): a union here would put pydantic's branch names in the error.
    content: Any = Field(None, description="The text, or a list of {type: 'text', text} parts; an assistant "
                                           "message with tool_calls may have none.")
    tool_calls: list[dict[str, Any]] | None = Field(None, max_length=MAX_LIST_ITEMS,
                                                    description="An assistant's earlier calls.")
    tool_call_id: str | None = Field(None, max_length=MAX_ID_CHARS, description="The call a tool message answers.")
    name: str | None = Field(None, max_length=MAX_NAME_CHARS,
                             description="Accepted; the chat template decides whether it is shown.")


class _Sampling(_Body):
    model: str = Field(max_length=MAX_ID_CHARS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_GENERATED_TOKENS, description="Most tokens to generate.")
    temperature: float | None = Field(None, ge=0, le=2, description="0: greedy; default 1.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling mass; default 1.")
    n: Int64 | None = Field(None, description="Choices per request (1-8), generated one after another; with a "
                                              "seed, choice i samples with seed + i.")
    stop: Any = Field(None, description="Up to 4 strings; the output ends before the first one.")
    seed: Int64 | None = Field(None, description="Makes sampling repeatable.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, description="Only 0.")
    presence_penalty: float | None = Field(None, description="Only 0.")
    logit_bias: dict[str, float] | None = Field(None, description="Only empty.")
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)
    # the sampling extensions, named and defined as vLLM's OpenAI server takes them
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K, description="Extension: draw only from the k likeliest "
                                                                     "tokens; -1 or 0: off.")
    min_tokens: int | None = Field(None, ge=0, le=MAX_GENERATED_TOKENS,
                                   description="Extension: no end-of-sequence token before this many tokens.")
    ignore_eos: bool | None = Field(None, description="Extension: go on after an end-of-sequence token.")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="Extension: > 1 discourages tokens "
                                                                            "of the prompt and the output; 1: off.")


class ChatCompletionBody(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_GENERATED_TOKENS,
                                              description="Most tokens to generate (wins over max_tokens).")
    logprobs: bool | None = Field(None, description="Each generated token's log probability (choices[].logprobs).")
    top_logprobs: Int64 | None = Field(None, description="With logprobs: the 0-20 likeliest tokens at each position.")
    response_format: dict[str, Any] | None = Field(None, description="text, json_object (constrained decoding) or "
                                                                     "json_schema (constrained, then checked).")
    tools: list[dict[str, Any]] | None = Field(None, max_length=tool_calls.MAX_TOOLS,
                                               description="Functions the model may call (serve/tools.py).")
    tool_choice: Any = Field(None, description="none, auto (the default with tools), required, or a named "
                                               "function.")
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    store: bool | None = None
    service_tier: str | None = Field(None, max_length=MAX_NAME_CHARS)


class CompletionBody(_Sampling):
    # Checked by hand (`_completion_prompt`), for the same reason as message content.
    prompt: Any = Field(description="A string (or a list holding one), or token ids (or a list holding one list).")
    echo: bool | None = Field(False, description="Return the prompt before the completion.")
    best_of: Int64 | None = Field(None, description="Only 1.")
    logprobs: Int64 | None = Field(None, description="0-5: each generated token's log probability and the "
                                                     "likeliest tokens at its position (choices[].logprobs).")
    suffix: str | None = Field(None, description="Not supported.")


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={**error_responses(404, 422, 429, 503), **event_stream(ChatCompletionChunk, _STREAMED)})
async def chat_completions(body: ChatCompletionBody, request: Request, tenant: Tenant = TENANT,
                           session: Session = deps.SESSION, platform: Platform = PLATFORM) -> Any:
    started = time.monotonic()
    _check_chat_extras(body)
    tools = tool_calls.check_tools(body.tools)
    choice = tool_calls.check_tool_choice(body.tool_choice, tools)
    shown = tools if choice != "none" else ()
    prompt = Prompt(messages=tuple(_chat_message(m, index) for index, m in enumerate(body.messages)), tools=shown)
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = _sampling(body, max_tokens, platform)
    if body.logprobs:
        params = replace(params, logprobs=int(body.top_logprobs or 0))
    schema = shapes.response_format(body.response_format, [m["content"] for m in prompt.messages], bool(body.stream))
    if choice not in ("none", "auto"):  # a call is forced: its arguments are decoded as a JSON object
        if shapes.wants_json(body.response_format):
            raise invalid("a forced tool call cannot be combined with a JSON response_format", param="tool_choice")
        schema = tool_calls.forced_schema(tools, choice)
    await shapes.check_answer_schema(schema, tools, choice)  # in a thread: meta-schemas are costly
    if shapes.wants_json(body.response_format) or schema is not None:
        params = replace(params, json_mode=True)
    n = _choices(body)  # checked before the engine exists: a bad request loads nothing
    resolved, routed, reply_id = await dispatch.resolve(request, session, tenant, platform, body, "chatcmpl",
                                                        started)
    target, created = resolved.target, int(time.time())
    if resolved.upstream is not None and (answer := await dispatch.proxied(
            "/v1/chat/completions", body, resolved, reply_id, routed, platform)) is not None:
        return _relayed(answer)
    engine = await _engine(platform, tenant)
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    head = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": target.name,
            "system_fingerprint": None}
    # every choice's tokens reserved at once; given back as the choices end (serve/budget.py)
    with engine.reserve(params.max_new_tokens, n, param=_tokens_param(body)) as lease:
        engine = engine.under(lease)
        if body.stream and not shown:
            sinks = await dispatch.observed(routed, platform,
                                            run_in_threadpool(_submitted, engine, target, prompt, params, n))
            return sse.chunks_response(_streamed_choices(sinks, head, include_usage, _chat_events, routed, platform),
                                       keepalive_s=platform.settings.stream_keepalive_s)
        # the choices decode side by side in the model's batch
        answers = await dispatch.observed(routed, platform, asyncio.gather(*(
            shapes.chat_choice(engine, target, prompt, _nth(params, index), schema, shown, choice)
            for index in range(n))))
    if routed is not None:
        await routed.finish(platform, "ok", [answer.completion.usage for answer in answers])
    if body.stream:  # with tools: whole answers (a call is known once it is complete), sent as chunks
        return sse.chunks_response(shapes.replayed(answers, head, include_usage, bool(body.logprobs)),
                                   keepalive_s=platform.settings.stream_keepalive_s)
    return {
        "id": reply_id, "object": "chat.completion", "created": created, "model": target.name,
        "choices": [{"index": index, "message": shapes.reply_message(answer), "finish_reason": answer.finish_reason,
                     "logprobs": {"content": list(answer.completion.logprobs), "refusal": None}
                     if body.logprobs else None} for index, answer in enumerate(answers)],
        "usage": shapes.total_usage([answer.completion for answer in answers]), "system_fingerprint": None,
    }


def _chat_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """A request message as the chat template reads it (a call's arguments as an object)."""
    shown: dict[str, Any] = {"role": _role(message.role)}
    if message.role == "assistant" and message.tool_calls:
        shown["content"] = "" if message.content is None else _message_text(message, index)
        shown["tool_calls"] = [_earlier_call(call, f"messages.{index}.tool_calls.{number}")
                               for number, call in enumerate(message.tool_calls)]
    else:
        shown["content"] = _message_text(message, index)
    if message.role == "tool":
        if not message.tool_call_id:
            raise invalid(f"messages.{index}.tool_call_id is missing: a tool message answers a call",
                          param=f"messages.{index}.tool_call_id")
        shown["tool_call_id"] = message.tool_call_id
    return shown


def _earlier_call(call: Any, param: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid(f"{param} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                      "\"arguments\"}}}}", param=param)
    arguments = function.get("arguments", "{}")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        raise invalid(f"{param}.function.arguments must be a JSON object as a string",
                      param=f"{param}.function.arguments") from None
    return {"id": str(call.get("id", "")), "type": "function",
            "function": {"name": function["name"], "arguments": parsed}}


@router.post("/completions", response_model=TextCompletion,
             responses={**error_responses(404, 429, 503), **event_stream(TextCompletionChunk, _STREAMED)})
async def completions(body: CompletionBody, request: Request, tenant: Tenant = TENANT,
                      session: Session = deps.SESSION, platform: Platform = PLATFORM) -> Any:
    started = time.monotonic()
    _check_completion_extras(body)
    prompt = _completion_prompt(body.prompt)
    params = _sampling(body, body.max_tokens, platform)
    if body.logprobs is not None:
        params = replace(params, logprobs=int(body.logprobs))
    n = _choices(body)  # checked before the engine exists: a bad request loads nothing
    resolved, routed, reply_id = await dispatch.resolve(request, session, tenant, platform, body, "cmpl", started)
    target, created = resolved.target, int(time.time())
    if resolved.upstream is not None and (answer := await dispatch.proxied(
            "/v1/completions", body, resolved, reply_id, routed, platform)) is not None:
        return _relayed(answer)
    echoed = prompt.text if body.echo and prompt.text is not None else ""
    engine = await _engine(platform, tenant)
    with engine.reserve(params.max_new_tokens, n) as lease:  # given back as the choices end
        engine = engine.under(lease)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            head = {"id": reply_id, "object": "text_completion", "created": created, "model": target.name,
                    "system_fingerprint": None}
            events = partial(_completion_events, echoed=echoed, logprobs=body.logprobs is not None)
            sinks = await dispatch.observed(routed, platform,
                                            run_in_threadpool(_submitted, engine, target, prompt, params, n))
            return sse.chunks_response(_streamed_choices(sinks, head, include_usage, events, routed, platform),
                                       keepalive_s=platform.settings.stream_keepalive_s)
        completions = await dispatch.observed(routed, platform, asyncio.gather(*(
            engine.acomplete(target, prompt, _nth(params, index)) for index in range(n))))
    if routed is not None:
        await routed.finish(platform, "ok", [completion.usage for completion in completions])
    return {
        "id": reply_id, "object": "text_completion", "created": created, "model": target.name,
        "choices": [{"text": echoed + c.text, "index": index, "finish_reason": c.finish_reason,
                     "logprobs": shapes.legacy_logprobs(c.logprobs, len(echoed))[0] if body.logprobs is not None
                     else None} for index, c in enumerate(completions)],
        "usage": shapes.total_usage(completions), "system_fingerprint": None,
    }


def _relayed(answer: Any) -> Response:
    """A vLLM server's answer, sent as it came (it is that server's shape, not checked against ours)."""
    return answer if isinstance(answer, Response) else JSONResponse(answer)


async def _engine(platform: Platform, tenant: Tenant) -> Any:
    """The engine as this tenant uses it, with its tier's bound on tokens in flight; created
    (torch imported) on a worker thread the first time."""
    engine = platform.inference or await run_in_threadpool(platform.inference_engine)
    return engine.for_tenant(tenant.tenant_id, platform.settings.inference_tokens_in_flight_for(tenant.tier))


def _tokens_param(body: _Sampling) -> str:
    """The field that set the tokens of each choice (chat: max_completion_tokens wins)."""
    return "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"


def _choices(body: _Sampling) -> int:
    if body.n is None:
        return 1
    if not 1 <= body.n <= MAX_CHOICES:
        raise invalid(f"n must be between 1 and {MAX_CHOICES}", param="n")
    return int(body.n)


def _nth(params: SamplingParams, index: int) -> SamplingParams:
    """The sampling of choice `index`: with a seed, seed + index (repeatable, and the choices differ)."""
    return params if params.seed is None or index == 0 else replace(params, seed=params.seed + index)


def _submitted(engine: Any, target: ModelTarget, prompt: Prompt, params: SamplingParams, n: int) -> list[Sink]:
    """Every choice queued at once (they decode side by side in the model's batch). Errors of the
    request (its prompt, a full queue) are raised here, before the response starts."""
    sinks: list[Sink] = []
    try:
        for index in range(n):
            sinks.append(engine.submit(target, prompt, _nth(params, index)))
    except BaseException:
        for sink in sinks:
            sink.cancel()
        raise
    return sinks


async def _streamed_choices(sinks: list[Sink], head: dict[str, Any], include_usage: bool,
                            events: Callable[..., AsyncIterator[dict[str, Any]]], routed: dispatch.Routed | None = None,
                            platform: Platform | None = None) -> AsyncIterator[dict[str, Any]]:
    """Each choice's chunks in turn (each tagged with its index), then the usage of them all when
    asked. Waiting for a chunk holds no thread: the sinks are awaited. A routed request is
    recorded when the stream ends, however it ends."""
    usage: list[Usage] = []
    outcome = "cancelled"
    try:
        for index, sink in enumerate(sinks):
            async with aclosing(events(sink, head, index, include_usage, usage)) as choice_events:
                async for event in choice_events:
                    if routed is not None and routed.first_token is None and "choices" in event:
                        routed.first_token = time.monotonic()
                    yield event
                    if "error" in event:
                        outcome = "error"
                        return
        outcome = "ok"
        if include_usage and usage:
            yield head | {"choices": [], "usage": Usage(usage[0].prompt_tokens,
                                                        sum(u.completion_tokens for u in usage)).as_dict()}
    finally:
        for sink in sinks:  # a client that went away: the batch drops the sequences
            sink.cancel()
        if routed is not None and platform is not None:
            routed.finish_soon(platform, outcome, usage)


# -- request checks --------------------------------------------------------------------------------

def _sampling(body: _Sampling, max_tokens: int | None, platform: Platform) -> SamplingParams:
    default_max_tokens = platform.settings.inference_default_max_tokens
    cap_tokens = platform.settings.inference_max_tokens_per_request
    if max_tokens is not None and max_tokens > cap_tokens:
        param = _tokens_param(body)
        raise invalid(f"{param} must be at most {cap_tokens} (this server's limit per choice)", param=param,
                      code="max_tokens_too_large")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name) not in (None, 0):
            raise invalid(f"{name}: only 0 is supported", param=name)
    if body.logit_bias:
        raise invalid("logit_bias is not supported", param="logit_bias")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options is only allowed with stream: true", param="stream_options")
    if body.min_tokens and body.min_tokens > (max_tokens or default_max_tokens):
        raise invalid(f"min_tokens ({body.min_tokens}) is more than the tokens allowed "
                      f"({max_tokens or default_max_tokens})", param="min_tokens")
    return SamplingParams(
        max_new_tokens=max_tokens or default_max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        stop=_stop_sequences(body.stop),
        seed=body.seed,
        top_k=max(0, body.top_k or 0),
        min_tokens=body.min_tokens or 0,
        ignore_eos=bool(body.ignore_eos),
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
    )


def _stop_sequences(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    sequences = [stop] if isinstance(stop, str) else stop
    if not isinstance(sequences, list) or not all(isinstance(s, str) for s in sequences):
        raise invalid("stop must be a string or a list of strings", param="stop")
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise invalid(f"stop takes at most {MAX_STOP_SEQUENCES} sequences, not {len(sequences)}", param="stop")
    if any(s == "" for s in sequences):
        raise invalid("stop sequences must not be empty", param="stop")
    return tuple(sequences)


def _check_chat_extras(body: ChatCompletionBody) -> None:
    if body.top_logprobs is not None:
        if not body.logprobs:
            raise invalid("top_logprobs needs logprobs: true", param="top_logprobs")
        if not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
            raise invalid(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")


def _check_completion_extras(body: CompletionBody) -> None:
    if body.best_of not in (None, 1):
        raise invalid("best_of: only 1 is supported", param="best_of")
    if body.logprobs is not None:
        if not 0 <= body.logprobs <= shapes.MAX_LEGACY_LOGPROBS:
            raise invalid(f"logprobs must be between 0 and {shapes.MAX_LEGACY_LOGPROBS}", param="logprobs")
        if body.echo:
            raise invalid("logprobs with echo (scores of the prompt's own tokens) is not supported; ask without "
                          "echo", param="logprobs")
    if body.suffix:
        raise invalid("suffix is not supported", param="suffix")


def _role(role: str) -> str:
    # OpenAI's newer name for the system message; chat templates know "system".
    return "system" if role == "developer" else role


def _message_text(message: ChatMessage, index: int) -> str:
    param = f"messages.{index}.content"
    content = message.content
    if isinstance(content, str):
        return content
    if content is None:
        raise invalid(f"{param} is missing", param=param)
    if not isinstance(content, list):
        raise invalid(f"{param} must be a string or a list of text parts", param=param)
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise invalid(f"{param}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported, "
                          f"not {kind!r}", param=param)
        texts.append(part["text"])
    return "".join(texts)


def _completion_prompt(prompt: Any) -> Prompt:
    """One prompt: a string, or token ids. OpenAI's batches (a list of several) answer 400."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return Prompt(text=prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return Prompt(token_ids=tuple(prompt))
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid("prompt: only one prompt per request is supported", param="prompt")
    raise invalid("prompt must be a string or a list of token ids", param="prompt")


# -- streamed answers -------------------------------------------------------------------------------

async def _guarded(chunks: Sink) -> AsyncIterator[Chunk | ApiError]:
    """The chunks; a failure once the answer has started can only be reported in the stream."""
    try:
        async for chunk in chunks:
            yield chunk
    except ApiError as exc:
        yield exc
    except Exception:  # noqa: BLE001 - the status line is gone; the client still gets an error event
        _log.exception("generation failed in a stream")
        yield ApiError(500, "The server had an error while generating.", type="server_error", code="internal_error")
    finally:
        chunks.cancel()


async def _chat_events(chunks: Sink, head: dict[str, Any], index: int, include_usage: bool,
                       usage: list[Usage]) -> AsyncIterator[dict[str, Any]]:
    """Choice `index`'s chunks; its usage is appended to `usage` (sent by the caller once for all)."""
    extra = {"usage": None} if include_usage else {}

    def event(delta: dict[str, Any], finish_reason: str | None = None, logprobs: tuple = ()) -> dict[str, Any]:
        shown = {"content": list(logprobs), "refusal": None} if logprobs else None
        return head | {"choices": [{"index": index, "delta": delta, "logprobs": shown,
                                    "finish_reason": finish_reason}]} | extra

    yield event({"role": "assistant", "content": ""})
    async for chunk in _guarded(chunks):
        if isinstance(chunk, ApiError):
            yield chunk.envelope()
            return
        if chunk.text or chunk.logprobs:
            yield event({"content": chunk.text}, logprobs=chunk.logprobs)
        if chunk.finish_reason is not None:
            yield event({}, chunk.finish_reason)
            if chunk.usage is not None:
                usage.append(chunk.usage)


async def _completion_events(chunks: Sink, head: dict[str, Any], index: int, include_usage: bool,
                             usage: list[Usage], echoed: str, logprobs: bool = False
                             ) -> AsyncIterator[dict[str, Any]]:
    extra = {"usage": None} if include_usage else {}
    offset = len(echoed)

    def event(text: str, finish_reason: str | None = None, scores: tuple = ()) -> dict[str, Any]:
        nonlocal offset
        shown = None
        if logprobs and scores:
            shown, offset = shapes.legacy_logprobs(scores, offset)
        return head | {"choices": [{"text": text, "index": index, "logprobs": shown,
                                    "finish_reason": finish_reason}]} | extra

    if echoed:
        yield event(echoed)
    async for chunk in _guarded(chunks):
        if isinstance(chunk, ApiError):
            yield chunk.envelope()
            return
        if chunk.text or chunk.logprobs or chunk.finish_reason is not None:
            yield event(chunk.text, chunk.finish_reason, chunk.logprobs)
        if chunk.finish_reason is not None and chunk.usage is not None:
            usage.append(chunk.usage)
        if chunk.finish_reason is not None and include_usage and chunk.usage is not None:
            yield head | {"choices": [], "usage": chunk.usage.as_dict()}
