from __future__ import annotations

from dataclasses import dataclass

import openai
import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_base_model, add_tenant, fake_model_dir, make_platform
from tuneforge.api.app import create_app
from tuneforge.services.context import Platform


@dataclass
class ApiWorld:
    platform: Platform
    http: TestClient
    key_a: str
    key_b: str
    base_model: str

    def sdk(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=self.http, max_retries=0)

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def world(tmp_path, database_url) -> ApiWorld:
    platform = make_platform(tmp_path, database_url)
    add_base_model(platform, "tiny-base", fake_model_dir(tmp_path / "model"))
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    world = ApiWorld(platform, http, add_tenant(platform, "alpha"), add_tenant(platform, "beta"), "tiny-base")
    yield world
    http.close()
    platform.db.dispose()
