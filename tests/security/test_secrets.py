"""Tenant secrets: stored sealed, never shown again, the tenant's own only; job configs
reference them by name and can no longer name an environment variable."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.unit.api.conftest import world  # noqa: F401 - the fixture
from tuneforge.db.tables import TenantSecret
from tuneforge.security.crypto import SEALED_PREFIX

VALUE = "sk-judge-4b1d5f0c9e"


def _put(world, key, name="JUDGE_KEY", value=VALUE):  # noqa: F811
    return world.http.post("/v1/secrets", json={"name": name, "value": value}, headers=world.headers(key))


def test_a_secret_is_stored_sealed_and_never_shown_again(world):  # noqa: F811
    created = _put(world, world.key_a)
    assert created.status_code == 201
    assert created.json()["name"] == "JUDGE_KEY" and VALUE not in created.text
    listed = world.http.get("/v1/secrets", headers=world.headers(world.key_a))
    assert listed.status_code == 200 and [s["name"] for s in listed.json()["data"]] == ["JUDGE_KEY"]
    assert VALUE not in listed.text and "value" not in listed.json()["data"][0]
    with world.platform.db.session() as session:
        stored = session.scalar(select(TenantSecret.value))
    assert stored.startswith(SEALED_PREFIX) and VALUE not in stored
    assert world.platform.sealer.open(stored) == VALUE


def test_putting_a_name_again_replaces_the_value(world):  # noqa: F811
    assert _put(world, world.key_a).status_code == 201
    again = _put(world, world.key_a, value="sk-rotated")
    assert again.status_code == 200
    with world.platform.db.session() as session:
        stored = list(session.scalars(select(TenantSecret.value)))
    assert len(stored) == 1 and world.platform.sealer.open(stored[0]) == "sk-rotated"


def test_another_tenant_neither_sees_nor_deletes_a_secret(world):  # noqa: F811
    _put(world, world.key_a)
    assert world.http.get("/v1/secrets", headers=world.headers(world.key_b)).json()["data"] == []
    assert world.http.delete("/v1/secrets/JUDGE_KEY", headers=world.headers(world.key_b)).status_code == 404
    deleted = world.http.delete("/v1/secrets/JUDGE_KEY", headers=world.headers(world.key_a))
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert world.http.get("/v1/secrets", headers=world.headers(world.key_a)).json()["data"] == []


@pytest.mark.parametrize(("body", "param"), [
    ({"name": "../etc/passwd", "value": "x"}, "name"),
    ({"name": "", "value": "x"}, "name"),
    ({"name": "K" * 65, "value": "x"}, "name"),
    ({"name": "K", "value": ""}, "value"),
    ({"name": "K", "value": "x" * 8193}, "value"),
    ({"name": "K"}, "value"),
    ({"name": "K", "value": "x", "env": "HOME"}, "env"),
])
def test_a_bad_secret_is_a_400_naming_the_field(world, body, param):  # noqa: F811
    answer = world.http.post("/v1/secrets", json=body, headers=world.headers(world.key_a))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_secrets_need_a_key(world):  # noqa: F811
    assert world.http.get("/v1/secrets").status_code == 401
    assert world.http.post("/v1/secrets", json={"name": "K", "value": "v"}).status_code == 401
