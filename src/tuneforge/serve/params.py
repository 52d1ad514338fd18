"""What an inference request asks for, in plain dataclasses (no torch, no HTTP):
the model to run, the prompt, the sampling parameters, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneforge.domain.spec import BaseModelRef

ADAPTER = "adapter"  # a LoRA/QLoRA adapter, served on its base model
FULL_MODEL = "model"  # a full fine-tune: its own complete weights


@dataclass(frozen=True)
class ModelTarget:
    """The weights a request runs on: a base model alone, or a fine-tuned artifact on it."""

    name: str  # as the request named it; echoed in responses
    base: BaseModelRef
    artifact_prefix: str | None = None  # None: the base model alone
    artifact_kind: str = ADAPTER

    @property
    def is_base(self) -> bool:
        return self.artifact_prefix is None


@dataclass(frozen=True)
class Prompt:
    """A chat conversation (rendered with the model's chat template) or a plain text prompt."""

    messages: tuple[dict[str, Any], ...] | None = None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None  # a completions prompt given as token ids
    tools: tuple[dict[str, Any], ...] = ()  # function tools the chat template is given (serve/tools.py)

    @property
    def param(self) -> str:
        """The request field an error about this prompt names."""
        return "messages" if self.messages is not None else "prompt"


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: int | None = None  # None: none; k >= 0: each token's log probability and its k likeliest rivals
    json_mode: bool = False  # the output is one JSON object (serve/constrained.py)
    # the sampling extensions, as vLLM names them
    top_k: int = 0  # 0: off; k: only the k likeliest tokens are drawn from
    min_tokens: int = 0  # no EOS before this many tokens
    ignore_eos: bool = False  # an EOS token does not end the generation
    repetition_penalty: float = 1.0  # 1: off; > 1 discourages tokens of the prompt and the output


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass(frozen=True)
class Chunk:
    """A piece of generated text; the last one of a generation carries finish_reason and usage."""

    text: str
    finish_reason: str | None = None  # "stop" (EOS or a stop string) | "length"
    usage: Usage | None = None
    # with SamplingParams.logprobs: the tokens whose text this chunk releases (or held back before it),
    # each {"token", "logprob", "bytes", "top_logprobs"} as OpenAI's chat answers show them
    logprobs: tuple[dict, ...] = ()


@dataclass
class Completion:
    text: str
    finish_reason: str
    usage: Usage
    logprobs: tuple[dict, ...] = ()
