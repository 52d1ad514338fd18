"""The one error type services raise for a request that cannot be served.

The API turns it into OpenAI's envelope
`{"error": {"message", "type", "param", "code"}}` with `status_code`.
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


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


# pydantic's errors for a value that should have been an object
_NOT_AN_OBJECT = ("model_attributes_type", "dict_type", "model_type")
# where FastAPI says a value came from: the first part of an error's `loc`, not a field
_LOCATIONS = ("body", "query", "path", "header", "form")


def _param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in _LOCATIONS]
    # pydantic puts the union branch name in the path ('int', 'literal[...]'): drop it
    parts = [p for p in parts
             if not p.startswith(("literal[", "function-")) and p not in ("int", "float", "str", "bool")]
    return ".".join(parts) or None


def from_validation_errors(errors: Sequence[Any], prefix: tuple[str, ...] = (),
                           model: type[BaseModel] | None = None) -> ApiError:
    """The 400 for pydantic validation errors, in the API's terms; `prefix`: where the validated
    value sits in the request body; `model`: what was validated, whose field names an unknown
    parameter's message suggests ("did you mean n_epochs?")."""
    located = [{**e, "loc": (*prefix, *e["loc"])} for e in errors]
    for err in located:
        if err.get("type") == "json_invalid":
            return ApiError(400, "We could not parse the JSON body of your request. "
                                 f"({err.get('ctx', {}).get('error', 'invalid JSON')})", code="invalid_json")
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    if extra:
        return _unknown_parameters(extra, prefix, model)
    first = located[0]
    param = _param(first["loc"])
    if first.get("type") == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param=param, code="missing_required_parameter")
    if param is None and all(e.get("type") in _NOT_AN_OBJECT for e in located):
        # the body as a whole is not a JSON object (e.g. curl -d without a JSON Content-Type)
        return ApiError(400, "The request body must be a JSON object, sent with Content-Type: application/json",
                        code="invalid_body")
    plain = _wrong_type(located, param)
    if plain is not None:
        return ApiError(400, plain, param=param, code="invalid_value")
    messages = sorted({f"{_param(e['loc'])}: {e['msg']}" for e in located})
    return ApiError(400, "Invalid value for " + "; ".join(messages), param=param, code="invalid_value")


def _unknown_parameters(extra: Sequence[Any], prefix: tuple[str, ...], model: type[BaseModel] | None) -> ApiError:
    named: dict[str, str] = {}
    for err in extra:
        name = _param((*prefix, *err["loc"])) or "?"
        known = _field_names(model, err["loc"][:-1]) if model is not None else []
        close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6) if known else []
        if not close and model is not None:  # a known name at the wrong level: where it belongs
            scope = _field_names_model(model, err["loc"][:-1])
            deeper = _paths_to(scope, str(err["loc"][-1])) if scope is not None else []
            close = [".".join(p for p in (_param((*prefix, *err["loc"][:-1])), deeper[0]) if p)] if deeper else []
        named[name] = f"{name} (did you mean {close[0]}?)" if close else name
    names = sorted(named)
    return ApiError(400, f"Unknown parameter(s): {', '.join(named[n] for n in names)}", param=names[0],
                    code="unknown_parameter")


def _field_names(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The names a body may give beside the last part of `path` in `model` (list indexes skipped)."""
    current = _field_names_model(model, path)
    if current is None:
        return []
    return [info.alias or name for name, info in current.model_fields.items()]


def _field_names_model(model: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that holds the fields at `path` in `model` (None where `path` leaves the models)."""
    current: type[BaseModel] | None = model
    for part in path:
        if isinstance(part, int) or part in _LOCATIONS or current is None:
            continue
        field = current.model_fields.get(str(part)) or next(
            (f for f in current.model_fields.values() if f.alias == part), None)
        current = _model_in(field.annotation) if field is not None else None
    return current


def _paths_to(model: type[BaseModel], name: str, depth: int = 3) -> list[str]:
    """Dotted paths below `model` (at most `depth` levels) that end in a field `name`, shortest first:
    where a name given at the wrong level belongs (`n_epochs` -> `hyperparameters.n_epochs`)."""
    found: list[str] = []
    if depth <= 0:
        return found
    for field_name, info in model.model_fields.items():
        inner = _model_in(info.annotation)
        if inner is None:
            continue
        key = info.alias or field_name
        if name in inner.model_fields or any(f.alias == name for f in inner.model_fields.values()):
            found.append(f"{key}.{name}")
        found += [f"{key}.{path}" for path in _paths_to(inner, name, depth - 1)]
    return sorted(found, key=lambda path: (path.count("."), path))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (through Optional, list[...], Annotated), if one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# what each pydantic type error says a value must be, in the words of a JSON body
_EXPECTED = {
    "int_parsing": "an integer", "int_type": "an integer", "int_from_float": "an integer",
    "float_parsing": "a number", "float_type": "a number",
    "bool_parsing": "true or false", "bool_type": "true or false",
    "string_type": "a string", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object", "list_type": "a list",
}
_SHOWN_INPUT_CHARS = 60


def _wrong_type(errors: list[Any], param: str | None) -> str | None:
    """`n_epochs must be an integer or "auto", got "many"` when every error is about the type of one
    value (pydantic's union message lists one line per branch); None for anything else."""
    if param is None or any(_param(e["loc"]) != param for e in errors):
        return None
    wanted: list[str] = []
    for err in errors:
        kind = err.get("type")
        if kind == "literal_error":
            said = str((err.get("ctx") or {}).get("expected", ""))
            choices = [c.strip().strip("'") for c in said.replace(" or ", ",").split(",") if c.strip()]
            wanted.extend(json.dumps(choice) for choice in choices)
        elif kind in _EXPECTED:
            wanted.append(_EXPECTED[kind])
        else:
            return None
    wanted = list(dict.fromkeys(wanted))
    alternatives = wanted[0] if len(wanted) == 1 else ", ".join(wanted[:-1]) + " or " + wanted[-1]
    try:
        given = json.dumps(errors[0].get("input"), default=str)
    except (TypeError, ValueError):
        given = repr(errors[0].get("input"))
    if len(given) > _SHOWN_INPUT_CHARS:
        given = given[:_SHOWN_INPUT_CHARS] + "…"
    return f"{param} must be {alternatives}, got {given}"
