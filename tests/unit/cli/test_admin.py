from __future__ import annotations

from sqlalchemy import text

from tests.helpers.cli import Done, run
from tests.helpers.platform import fake_model_dir
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.services.context import Platform
from tuneforge.settings import Settings


def _cli(env: dict[str, str], *args: str) -> Done:
    # in-process with its own environment (tests/helpers/cli.py), as the keys and quota commands'
    # tests run: a new interpreter per command cost ~1.5 s each, ~30 s for this file
    return run(*args, env=env)


def test_tenant_key_is_alone_on_the_last_line_and_authenticates(tmp_path, database_url):
    env = {"TUNEFORGE_HOME": str(tmp_path / "home"), "TUNEFORGE_DATABASE_URL": database_url}
    assert _cli(env, "init").returncode == 0
    created = _cli(env, "tenants", "create", "acme", "--tier", "premium")
    assert created.returncode == 0, created.stderr
    api_key = created.stdout.strip().splitlines()[-1]
    assert api_key.startswith("tf-") and " " not in api_key
    platform = Platform.from_settings(Settings(home=tmp_path / "home", database_url=database_url))
    try:
        with platform.db.session() as session:
            tenant = tenant_repo.by_api_key(session, api_key)
            assert tenant is not None and tenant.name == "acme" and tenant.tier == "premium"
            stored = list(session.execute(text("select key_hash from api_keys")).scalars())
            assert api_key not in stored and len(stored[0]) == 64  # only the hash is stored
    finally:
        platform.db.dispose()
    again = _cli(env, "tenants", "create", "acme")
    assert again.returncode == 2 and "already exists" in again.stderr


def test_base_model_add_pins_sha_and_rejects_a_folder_without_weights(tmp_path, database_url):
    env = {"TUNEFORGE_HOME": str(tmp_path / "home"), "TUNEFORGE_DATABASE_URL": database_url}
    assert _cli(env, "init").returncode == 0
    model = fake_model_dir(tmp_path / "model")
    added = _cli(env, "base-models", "add", "tiny", str(model))
    assert added.returncode == 0, added.stderr
    assert "sha256" in added.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    refused = _cli(env, "base-models", "add", "broken", str(tmp_path / "empty"))
    assert refused.returncode == 2 and "no weight files" in refused.stderr


def test_tenants_delete_and_audit_commands(tmp_path, database_url):
    env = {"TUNEFORGE_HOME": str(tmp_path / "home"), "TUNEFORGE_DATABASE_URL": database_url}
    assert _cli(env, "init").returncode == 0
    assert _cli(env, "tenants", "create", "acme").returncode == 0
    assert _cli(env, "tenants", "create", "other").returncode == 0
    refused = _cli(env, "tenants", "delete", "acme")  # not a terminal, no --yes: nothing is deleted
    assert refused.returncode != 0
    deleted = _cli(env, "tenants", "delete", "acme", "--yes", "--json")
    assert deleted.returncode == 0, deleted.stderr
    import json

    body = json.loads(deleted.stdout)
    assert body["status"] == "deleted" and body["keys_revoked"] == 1
    assert body["export_key"].startswith("admin/tenant-exports/")
    again = _cli(env, "tenants", "delete", "acme", "--yes")
    assert again.returncode == 0 and "deleted" in again.stderr
    assert _cli(env, "tenants", "delete", "nobody", "--yes").returncode == 2

    shown = _cli(env, "audit", "--tenant", "acme", "--json")
    assert shown.returncode == 0, shown.stderr
    actions = [row["action"] for row in json.loads(shown.stdout)["data"]]
    assert actions == ["create_tenant", "tenant.export", "tenant.purge", "delete_tenant", "delete_tenant"]
    table = _cli({**env, "COLUMNS": "250"}, "audit", "--action", "create_tenant")
    assert table.returncode == 0 and "create_tenant" in table.stdout
