"""A running control plane for end-to-end tests, on the executor under test.

By default trainers run under the local executor with the object store in a
local folder. In the ray stage of scripts/test.sh (TUNEFORGE_TEST_EXECUTOR=ray)
every plane runs its attempts on a Ray cluster of this host (a head with 4
logical GPUs) with its objects in a fresh S3 bucket (moto): the same tests,
the cluster configuration.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers import ray_cluster, schema
from tests.helpers.net import free_port
from tuneforge.server import ControlPlane
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.tenancy import tenants as tenant_service
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

    def close(self) -> None:
        """Stop the plane, and on a Ray cluster free whatever its attempts still hold there
        (a plane that stops leaves its attempts running on purpose; a test must not)."""
        if self.plane.executor is not None:
            self.plane.executor.reap(set())
        self.plane.close()


# Settings every plane of the current test gets from the executor under test (see below).
E2E_NAMESPACE = f"tf-e2e-{uuid.uuid4().hex[:8]}"
EXECUTOR_OVERRIDES: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def executor_under_test(request, monkeypatch, tmp_path) -> dict[str, Any]:
    """In the ray stage: run this test's planes on the session's Ray cluster, connected
    through Ray Client (ray://) as a control plane outside the cluster would be, with a
    fresh S3 bucket. The tests share one namespace (each test's attempts are its own jobs'
    and are freed when its planes close), and so the node's warm trainer, which lives there:
    as the planes of one deployment restarted one after the other would."""
    if not ray_cluster.ray_stage():
        return {}
    cluster = request.getfixturevalue("ray_head")
    storage = request.getfixturevalue("s3_storage")
    overrides = ray_cluster.plane_settings(cluster, storage, tmp_path / "nodes", client=True,
                                           namespace=E2E_NAMESPACE)
    monkeypatch.setattr(f"{__name__}.EXECUTOR_OVERRIDES", overrides)
    return overrides


def start_plane(tmp_path: Path, database_url: str, model_dir: Path, **overrides) -> Running:
    # jobs skip the post-training eval unless a test asks for it (tests/e2e/test_eval_gates.py)
    overrides.setdefault("eval_by_default", False)
    overrides = {**EXECUTOR_OVERRIDES, **overrides}
    settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port(),
                        heartbeat_interval_s=1.0, scheduler_tick_s=0.2, **overrides)
    schema.at_head(settings.resolved_database_url)  # a fresh SQLite file: a copy of the schema the plane finds
    plane = ControlPlane(settings).start_in_background()
    if EXECUTOR_OVERRIDES:  # the ray stage must not pass by running trainers locally
        assert type(plane.executor).__name__ == "RayExecutor", plane.executor
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
    world.close()


@pytest.fixture(scope="session")
def aligned_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny base model that answers the golden set and refuses harmful prompts, built once."""
    from tests.helpers.aligned import build_aligned_model

    return build_aligned_model(tmp_path_factory.mktemp("aligned") / "model")
