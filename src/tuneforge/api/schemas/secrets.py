"""A tenant's stored secrets (/v1/secrets), an extension: names and dates, never a value."""

from __future__ import annotations

from typing import Literal

from tuneforge.api.schemas.base import ApiObject


class Secret(ApiObject):
    object: Literal["secret"]
    name: str
    created_at: int
    updated_at: int


class SecretList(ApiObject):
    object: Literal["list"]
    data: list[Secret]
    has_more: bool


class SecretDeleted(ApiObject):
    object: Literal["secret"]
    name: str
    deleted: Literal[True]
