"""The attack suite's server: one real `tuneforge up` (two API workers, scheduler, local executor)
shared by the modules of this folder that need no server of their own; each module sees it through
an attacker and a bystander of its own (tests/helpers/attack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.attack import LiveServer


@pytest.fixture(scope="package")
def shared_live(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> Iterator[LiveServer]:
    server = LiveServer.start(tmp_path_factory.mktemp("live"), tiny_model_dir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live(shared_live: LiveServer, request: pytest.FixtureRequest) -> LiveServer:
    return shared_live.with_new_tenants(request.module.__name__.rsplit(".", 1)[-1])
