"""The attack suite's server: one real `tuneforge up` (two API workers, scheduler, local executor)
shared by a test module, with tenants `attacker` and `bystander` (tests/helpers/attack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.attack import LiveServer


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> Iterator[LiveServer]:
    server = LiveServer.start(tmp_path_factory.mktemp("live"), tiny_model_dir)
    yield server
    server.stop()
