"""A module imported on first use: the CLI's operator commands need the whole platform (database,
services), its tenant commands only an HTTP client."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class Lazy:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)
