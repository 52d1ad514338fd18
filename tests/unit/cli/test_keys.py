"""`tuneforge tenants keys create|list|revoke` on the metadata store."""

from __future__ import annotations

import time

from tests.helpers.cli import Done, run
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.services.context import Platform
from tuneforge.settings import Settings


def _cli(env: dict[str, str], *args: str) -> Done:
    return run(*args, env=env)


def test_keys_create_list_and_revoke(tmp_path, database_url):
    env = {"TUNEFORGE_HOME": str(tmp_path / "home"), "TUNEFORGE_DATABASE_URL": database_url}
    assert _cli(env, "init").returncode == 0
    first = _cli(env, "tenants", "create", "acme").stdout.strip().splitlines()[-1]
    created = _cli(env, "tenants", "keys", "create", "acme", "--expires-in", "3600", "--label", "ci")
    assert created.returncode == 0, created.stderr
    second = created.stdout.strip().splitlines()[-1]
    assert second.startswith("tf-") and second != first and "expires" in created.stderr
    key_id = next(word for word in created.stderr.split() if word.startswith("key-"))  # (after the home line)

    listed = _cli(env, "tenants", "keys", "list", "acme")
    assert listed.returncode == 0, listed.stderr
    assert key_id in listed.stdout and "ci" in listed.stdout and second[:10] in listed.stdout
    assert first not in listed.stdout + listed.stderr and second not in listed.stdout + listed.stderr

    revoked = _cli(env, "tenants", "keys", "revoke", "acme", key_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stderr, revoked.stderr
    platform = Platform.from_settings(Settings(home=tmp_path / "home", database_url=database_url))
    try:
        with platform.db.session() as session:
            assert tenant_repo.by_api_key(session, second) is None
            assert tenant_repo.by_api_key(session, first).name == "acme"
            key = tenant_repo.key_of(session, tenant_repo.by_name(session, "acme").tenant_id, key_id)
            assert key.name == "ci" and abs(key.expires_at - (key.created_at + 3600)) <= 1
            assert key.revoked_at <= time.time()
    finally:
        platform.db.dispose()

    assert _cli(env, "tenants", "keys", "revoke", "acme", "key-unknown").returncode == 2
    refused = _cli(env, "tenants", "keys", "create", "acme", "--expires-in", "0")
    assert refused.returncode == 2 and "expires_in_s" in refused.stderr
    assert _cli(env, "tenants", "keys", "list", "nobody").returncode == 2
