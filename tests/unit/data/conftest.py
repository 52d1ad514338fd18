from __future__ import annotations

from typing import Any

import pytest

from tuneforge.demo.tiny_model import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The demo model's real byte-level BPE tokenizer with its ChatML template."""
    return build_tokenizer()
