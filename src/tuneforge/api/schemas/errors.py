"""OpenAI's error body, which every error answer of the API carries (api/errors.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str = Field(description="What was wrong, naming the field.")
    type: str = Field(description="invalid_request_error, rate_limit_error, requests (a tenant's request rate "
                                  "limit), insufficient_quota, server_error.")
    param: str | None = Field(description="The parameter at fault, dotted (e.g. messages.0.content).")
    code: str | None = Field(description="A machine-readable code, e.g. invalid_value.")


class ErrorEnvelope(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail
