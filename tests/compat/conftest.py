"""A live API on 127.0.0.1 (uvicorn, no scheduler) that the official `openai` SDK talks to over
HTTP, as a user's code would after changing `base_url`; two tenants and the
tiny test model (a real tokenizer) registered as `tiny-base`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.helpers import schema
from tests.helpers.net import free_port
from tuneforge.server import ControlPlane
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.settings import Settings


@dataclass
class Live:
    plane: ControlPlane
    url: str
    key_a: str
    key_b: str

    def sdk(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.key_a, max_retries=0)

    @property
    def store(self):  # noqa: ANN201 - the platform's ObjectStore
        return self.plane.platform.store


def start_live(tmp_path: Path, database_url: str, model_dir: Path, **overrides) -> Live:
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port(), **overrides)
    schema.at_head(settings.resolved_database_url)  # a fresh SQLite file: a copy of the schema the plane finds
    plane = ControlPlane(settings, run_scheduler=False).start_in_background()
    with plane.platform.db.session() as session:
        _a, key_a = tenant_service.create_tenant(session, "acme")
        _b, key_b = tenant_service.create_tenant(session, "globex")
        base_model_service.add_base_model(session, plane.platform.store, "tiny-base", str(model_dir),
                                          tmp_path / "hub-cache")
    return Live(plane, plane.url, key_a, key_b)


@pytest.fixture
def live(tmp_path, database_url, tiny_model_dir) -> Live:
    world = start_live(tmp_path, database_url, tiny_model_dir)
    yield world
    world.plane.close()
