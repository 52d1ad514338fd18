"""Inference (/v1/chat/completions, /v1/completions): OpenAI's chat.completion and
text_completion, and the chunks of their streams (`stream: true`, Server-Sent Events ending with
`data: [DONE]`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject, Number


class CompletionUsage(ApiObject):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatLogprobs(ApiObject):
    content: list[dict[str, Any]] | None = Field(description="Each generated token: token, logprob, bytes, "
                                                             "top_logprobs.")
    refusal: list[dict[str, Any]] | None = None


class ChatMessage(ApiObject):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(default=None, description="Present when the model called "
                                                                              "tools.")


class ChatChoice(ApiObject):
    index: int
    message: ChatMessage
    finish_reason: str | None = Field(description="stop, length or tool_calls.")
    logprobs: ChatLogprobs | None = None


class ChatCompletion(ApiObject):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str = Field(description="The model that answered (a route's chosen version for route:NAME).")
    choices: list[ChatChoice]
    usage: CompletionUsage
    system_fingerprint: str | None = None


class ChatChunkChoice(ApiObject):
    index: int
    delta: dict[str, Any] = Field(description="role and content, content, or tool_calls; empty in the last.")
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(ApiObject):
    """One event of a chat completion's stream; with stream_options.include_usage a last chunk has
    no choices and the whole request's usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: CompletionUsage | None = None


class LegacyLogprobs(ApiObject):
    tokens: list[str]
    token_logprobs: list[Number]
    top_logprobs: list[dict[str, Number]]
    text_offset: list[int]


class CompletionChoice(ApiObject):
    text: str
    index: int
    finish_reason: str | None = None
    logprobs: LegacyLogprobs | None = None


class TextCompletion(ApiObject):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class TextCompletionChunk(ApiObject):
    """One event of a completion's stream: a text_completion with one choice's new text."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
