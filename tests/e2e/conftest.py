from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.helpers.net import free_port
from tuneforge.server import ControlPlane
from tuneforge.services import base_models as base_model_service
from tuneforge.services import tenants as tenant_service
from tuneforge.settings import Settings


@dataclass
class Running:
    plane: ControlPlane
    url: str
    key_a: str
    key_b: str
    model_dir: Path

    def sdk(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=2)


def start_plane(tmp_path: Path, database_url: str, model_dir: Path, **overrides) -> Running:
    # jobs skip the post-training eval unless a test asks for it (tests/e2e/test_eval_gates.py)
    overrides.setdefault("eval_by_default", False)
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port(),
                        heartbeat_interval_s=1.0, scheduler_tick_s=0.2, **overrides)
    plane = ControlPlane(settings).start_in_background()
    with plane.platform.db.session() as session:
        _a, key_a = tenant_service.create_tenant(session, "acme")
        _b, key_b = tenant_service.create_tenant(session, "globex")
        base_model_service.add_base_model(session, plane.platform.store, "tiny-chat", str(model_dir),
                                          tmp_path / "hub-cache")
    return Running(plane, plane.url, key_a, key_b, model_dir)


@pytest.fixture
def running(tmp_path, database_url, tiny_model_dir):
    world = start_plane(tmp_path, database_url, tiny_model_dir)
    yield world
    world.plane.close()


@pytest.fixture(scope="session")
def aligned_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny base model that answers the golden set and refuses harmful prompts, built once."""
    from tests.helpers.aligned import build_aligned_model

    return build_aligned_model(tmp_path_factory.mktemp("aligned") / "model")
