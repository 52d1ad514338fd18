from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.tiny import build_model_once


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny random Llama, built once for the whole session."""
    return build_model_once(tmp_path_factory)
