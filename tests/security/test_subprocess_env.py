"""Every subprocess the platform starts gets an allow-listed environment: a secret planted in
the control plane's environment reaches no trainer, data worker or Ray trainer process."""

from __future__ import annotations

import subprocess

import pytest

from tuneforge.domain.spec import JobSpec
from tuneforge.executors.local import LocalExecutor
from tuneforge.executors.protocol import Placement
from tuneforge.security.env import child_env, passes
from tuneforge.settings import Settings

PLANTED = "planted-7c4e2a91"
PLANTED_NAMES = ("TUNEFORGE_ADMIN_API_KEY", "TUNEFORGE_DATABASE_URL", "TUNEFORGE_SECRETS_KEY", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS", "OPENAI_API_KEY", "HF_TOKEN",
                 "DATABASE_URL", "MY_COMPANY_TOKEN")


@pytest.fixture
def planted(monkeypatch):
    for name in PLANTED_NAMES:
        monkeypatch.setenv(name, f"{PLANTED}-{name}")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")


class _Captured:
    def __init__(self) -> None:
        self.envs: list[dict[str, str]] = []


@pytest.fixture
def captured(monkeypatch) -> _Captured:
    seen = _Captured()

    class FakePopen:
        def __init__(self, *args, env=None, **kwargs) -> None:  # noqa: ANN002, ANN003
            seen.envs.append(dict(env))
            self.pid = 999_999

        def poll(self):  # noqa: ANN201
            return None

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    return seen


def _no_plant(env: dict[str, str]) -> None:
    leaked = sorted(name for name, value in env.items() if PLANTED in value)
    assert leaked == [], f"planted values reached a child: {leaked}"


def test_the_allow_list_passes_what_libraries_need_and_nothing_else(planted, monkeypatch):
    env = child_env({"TUNEFORGE_NODE": "node-0"})
    _no_plant(env)
    assert env["TUNEFORGE_NODE"] == "node-0" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["PATH"]
    assert not passes("TUNEFORGE_ADMIN_API_KEY") and not passes("AWS_ACCESS_KEY_ID") and passes("CUDA_VISIBLE_DEVICES")


def _plane_settings(tmp_path, **overrides) -> Settings:
    return Settings(home=tmp_path, storage_url="s3://bucket/prefix", s3_access_key_id="store-id",
                    s3_secret_access_key="store-secret", admin_api_key=f"{PLANTED}-admin",
                    database_url=f"postgresql+psycopg://u:{PLANTED}@db/tf", **overrides)


def _store_settings_pass(env: dict[str, str]) -> None:
    # a trainer reaches the store through the control plane's object proxy: it holds none of the
    # store's settings, credentials least of all
    assert not [name for name in env if name.startswith("TUNEFORGE_S3_") or name.startswith("AWS_")]
    assert "store-secret" not in repr(env) and "store-id" not in repr(env)


def test_a_trainer_given_the_store_itself_gets_its_settings_explicitly(planted, captured, tmp_path):
    settings = _plane_settings(tmp_path, trainer_warm_start=False, trainer_storage="direct")
    LocalExecutor(settings).launch(_spec(), Placement(node="node-0", gpu_ids=[0]))
    (env,) = captured.envs
    _no_plant(env)
    assert env["TUNEFORGE_S3_ACCESS_KEY_ID"] == "store-id" and env["TUNEFORGE_S3_SECRET_ACCESS_KEY"] == "store-secret"


def test_a_local_trainer_gets_no_store_setting_and_no_planted_secret(planted, captured, tmp_path):
    settings = _plane_settings(tmp_path, trainer_warm_start=False)
    LocalExecutor(settings).launch(_spec(), Placement(node="node-0", gpu_ids=[0]))
    (env,) = captured.envs
    _no_plant(env)
    _store_settings_pass(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["TUNEFORGE_NODE"] == "node-0"


def test_a_trainer_forked_warm_and_the_warm_trainer_get_no_planted_secret(planted, tmp_path, monkeypatch):
    # the real warm process's own environment is read from /proc in tests/unit/scheduler/test_warm_start.py
    executor = LocalExecutor(_plane_settings(tmp_path))
    assert executor._warm is not None
    _no_plant(executor._warm.env)  # what the warm process is started with
    _store_settings_pass(executor._warm.env)
    asked = []
    monkeypatch.setattr(executor._warm, "launch", lambda spec, env, cwd, log: asked.append(env) or (4242, "17"))
    handle = executor.launch(_spec(), Placement(node="node-0", gpu_ids=[0]))
    assert handle["warm"] and (handle["pid"], handle["started"]) == (4242, "17")
    (env,) = asked  # what the forked trainer takes as its environment
    _no_plant(env)
    _store_settings_pass(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["TUNEFORGE_NODE"] == "node-0"


def test_ray_trainer_processes_get_the_allow_listed_environment(planted, captured, tmp_path):
    from tuneforge.executors.ray_host import TrainerHost

    host = TrainerHost.__new__(TrainerHost)  # the actor's methods without Ray
    host.node_id, host.workdir, host.cache_dir = "n1", tmp_path, str(tmp_path / "cache")
    host.procs, host._logs = {}, {}
    host.start(_spec().to_json(), {"TUNEFORGE_S3_REGION": "eu"}, [0, 1], 2, "10.0.0.1", 29500)
    assert len(captured.envs) == 2
    for env in captured.envs:
        _no_plant(env)
        assert env["TUNEFORGE_S3_REGION"] == "eu" and env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500" and env["LOCAL_WORLD_SIZE"] == "2"


def test_data_check_workers_get_the_allow_listed_environment(planted, captured):
    from tuneforge.data import parallel

    try:
        parallel._Workers(2, ("setup",))
    except Exception:  # noqa: BLE001 - the fake process has no pipes; only its environment matters here
        pass
    assert captured.envs
    for env in captured.envs:
        _no_plant(env)


def _spec() -> JobSpec:
    from tests.unit.domain.test_spec import _spec as make_spec

    return make_spec(job_token="job-token")
