"""The one error type services raise for a request that cannot be served.

The API turns it into OpenAI's envelope
`{"error": {"message", "type", "param", "code"}}` with `status_code`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ApiError(Exception):
    status_code: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    # seconds after which the same request may succeed; sent as the Retry-After header (429, 503)
    retry_after: float | None = None

    def __str__(self) -> str:
        return self.message

    def envelope(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def not_found(message: str, param: str | None = None, code: str = "not_found") -> ApiError:
    return ApiError(404, message, "invalid_request_error", param, code)


def conflict(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(409, message, "invalid_request_error", param, code)


def unauthorized(message: str, code: str = "invalid_api_key") -> ApiError:
    return ApiError(401, message, "invalid_request_error", None, code)


def rate_limited(message: str, param: str | None = None, code: str | None = None,
                 retry_after: float | None = None) -> ApiError:
    """429: the same request may succeed later (e.g. once a queued job has started)."""
    return ApiError(429, message, "rate_limit_error", param, code, retry_after)


def quota_exceeded(message: str, code: str = "quota_exceeded") -> ApiError:
    """403: the tenant's quota refuses the request until it is raised or renewed."""
    return ApiError(403, message, "insufficient_quota", None, code)


def _param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form")]
    # pydantic puts the union branch name in the path ('int', 'literal[...]'): drop it
    parts = [p for p in parts
             if not p.startswith(("literal[", "function-")) and p not in ("int", "float", "str", "bool")]
    return ".".join(parts) or None


def from_validation_errors(errors: list[Any], prefix: tuple[str, ...] = ()) -> ApiError:
    """The 400 for pydantic validation errors, in the API's terms; `prefix`: where the validated
    value sits in the request body."""
    errors = [{**e, "loc": (*prefix, *e["loc"])} for e in errors]
    for err in errors:
        if err.get("type") == "json_invalid":
            return ApiError(400, "We could not parse the JSON body of your request. "
                                 f"({err.get('ctx', {}).get('error', 'invalid JSON')})", code="invalid_json")
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    if extra:
        names = sorted({_param(e["loc"]) or "?" for e in extra})
        return ApiError(400, f"Unknown parameter(s): {', '.join(names)}", param=names[0], code="unknown_parameter")
    first = errors[0]
    param = _param(first["loc"])
    if first.get("type") == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    messages = sorted({f"{_param(e['loc'])}: {e['msg']}" for e in errors})
    return ApiError(400, "Invalid value for " + "; ".join(messages), param=param, code="invalid_value")
