"""What every response model shares, and the route class that sends them unchanged.

`ApiObject` allows fields it does not declare: an answer keeps every field the route built. Its
declared fields must come first and in the answer's own order (pydantic writes declared fields
first, then the others in the order they came), so that a checked answer reads byte for byte as
the route built it. Numbers that may be whole or not are `Number` (a `float` field would turn 1
into 1.0).

`ObjectRoute` is the route class of every API router: it sends only the keys the route returned
(a declared field with a default that the route left out stays out) and encodes with
`JSONResponse` as routes without a model did, not with pydantic's own JSON writer (which writes
some floats differently, e.g. 1e-05 as 0.00001).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.datastructures import DefaultPlaceholder
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

Number = int | float


class ApiObject(BaseModel):
    model_config = ConfigDict(extra="allow")


class ObjectRoute(APIRoute):
    def __init__(self, path: str, endpoint: Any, **kwargs: Any) -> None:
        kwargs["response_model_exclude_unset"] = True
        if isinstance(kwargs.get("response_class"), DefaultPlaceholder):
            kwargs["response_class"] = JSONResponse
        super().__init__(path, endpoint, **kwargs)


class Deleted(ApiObject):
    """OpenAI's answer to a delete: the id, the object's type and `deleted: true`."""

    id: str
    object: str
    deleted: Literal[True]


class Page(ApiObject):
    """OpenAI's list object: a page of `data`, `has_more` when another page follows (ask with
    `after` = `last_id`), and the first and last ids of this page (null when it is empty)."""

    object: Literal["list"]
    data: list[Any]
    has_more: bool
    first_id: str | None = Field(default=None, description="The id of the first object of `data`.")
    last_id: str | None = Field(default=None, description="The id of the last object of `data`; the next "
                                                          "page's `after`.")
