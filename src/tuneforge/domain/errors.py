"""The one error type services raise for a request that cannot be served.

The API turns it into OpenAI's envelope
`{"error": {"message", "type", "param", "code"}}` with `status_code`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ApiError(Exception):
    status_code: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

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


def rate_limited(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """429: the same request may succeed later (e.g. once a queued job has started)."""
    return ApiError(429, message, "rate_limit_error", param, code)


def quota_exceeded(message: str, code: str = "quota_exceeded") -> ApiError:
    """403: the tenant's quota refuses the request until it is raised or renewed."""
    return ApiError(403, message, "insufficient_quota", None, code)
