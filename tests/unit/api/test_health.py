"""Liveness, readiness, the migration lock, and a busy database answered as 503 (never 500)."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tests.helpers.platform import make_platform
from tuneforge.api.app import create_app
from tuneforge.db.migrate import current_revision, downgrade, head_revision, upgrade
from tuneforge.scheduler.leader import LeaderLock, leader_known


def _ready(http: TestClient) -> tuple[int, dict]:
    http.app.state.readiness._last = None  # no memo between the steps of a test
    answer = http.get("/readyz")
    return answer.status_code, answer.json()


def test_readyz_names_what_is_missing_and_healthz_stays_up(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    http = TestClient(create_app(platform=platform))
    try:
        status, body = _ready(http)
        assert status == 503 and body["status"] == "not_ready"
        assert body["checks"] == {"database": "ok", "migrations": "ok", "object_store": "ok",
                                  "scheduler": "no_leader"}

        leader = LeaderLock(platform.settings.resolved_database_url, platform.settings.home)
        assert leader.holds()
        try:
            status, body = _ready(http)
            assert status == 200 and body["status"] == "ready"
            assert set(body["checks"].values()) == {"ok"}

            downgrade(platform.settings.resolved_database_url, "0008")
            status, body = _ready(http)
            assert status == 503 and body["checks"]["migrations"] == "not_at_head"
            upgrade(platform.settings.resolved_database_url)
            assert _ready(http)[0] == 200
        finally:
            leader.release()
        assert _ready(http)[1]["checks"]["scheduler"] == "no_leader"
        assert http.get("/healthz").json()["status"] == "ok"
    finally:
        http.close()
        platform.db.dispose()


def test_leader_known_sees_another_holder_without_taking_the_lock(tmp_path, database_url):
    settings_home = tmp_path / "home"
    url = make_platform(tmp_path, database_url).settings.resolved_database_url
    assert leader_known(url, settings_home) is False
    first, second = LeaderLock(url, settings_home), LeaderLock(url, settings_home)
    try:
        assert first.holds()
        assert leader_known(url, settings_home) is True
        assert not second.holds()  # the look left the lock with its holder
        first.release()
        assert leader_known(url, settings_home) is False
        assert second.holds()
    finally:
        first.release()
        second.release()


@pytest.mark.empty_database
def test_control_planes_starting_together_migrate_one_at_a_time(tmp_path, database_url):
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(database_url)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    engine = create_engine(database_url)
    try:
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_a_busy_database_answers_503_with_retry_after(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    app = create_app(platform=platform)

    @app.get("/locked")
    def locked() -> dict:
        raise OperationalError("UPDATE jobs", {}, sqlite3.OperationalError("database is locked"))

    @app.get("/pool")
    def pool() -> dict:
        raise PoolTimeout("QueuePool limit reached")

    @app.get("/other")
    def other() -> dict:
        raise OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: x"))

    http = TestClient(app, raise_server_exceptions=False)
    try:
        for path in ("/locked", "/pool"):
            answer = http.get(path)
            assert answer.status_code == 503
            assert answer.headers["Retry-After"] == "1"
            assert answer.json()["error"]["code"] == "server_busy"
            assert answer.headers["X-Request-Id"].startswith("req_")
            assert "database" not in answer.json()["error"]["message"]
        # any other database failure is the platform's own error: 500, and nothing of it shown
        other_answer = http.get("/other")
        assert other_answer.status_code == 500 and "no such table" not in other_answer.text
    finally:
        http.close()
        platform.db.dispose()
