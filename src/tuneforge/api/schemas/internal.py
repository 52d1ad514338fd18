"""Answers to trainer attempts (/internal/v1, by job token; not in the public reference)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tuneforge.api.schemas.base import ApiObject


class AttemptCredentials(ApiObject):
    secrets: dict[str, Any] = Field(description="The tenant's secrets the attempt's eval config names.")
    endpoints: dict[str, Any] = Field(description="The operator's endpoints the eval config names.")
    tracking: Any = Field(description="The credentials of the job's trackers.")


class ReportAnswer(ApiObject):
    """One of: {"action": "continue" | "stop"} (heartbeat), {"applied": n} (events),
    {"recovered_steps": n} (resumed), {"ok": true} (the other reports)."""

    action: str | None = None
    applied: int | None = None
    recovered_steps: Any = None
    ok: bool | None = None


class JudgeAnswer(ApiObject):
    replies: list[dict[str, Any]] = Field(description="Per conversation, in order: {text, tokens, completion_tokens, "
                                                      "refused}, or {error}: why the judge did not answer it.")


class ObjectKeys(ApiObject):
    keys: list[str] = Field(description="Every key under the prefix asked, recursively, sorted.")


class ObjectWritten(ApiObject):
    key: str = Field(description="The key written.")
    size_bytes: int = Field(description="How many bytes were written.")
