"""API key look-ups under concurrency: one database look-up per key at a time, busy keys
re-read in the background before their entry expires, refusals and changes never outlived."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.api import keys as key_lookups
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.domain.errors import ApiError
from tuneforge.services.tenancy import api_keys
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.services.tenancy.api_keys import KeyCache

LOOKUP_S = 0.05


@pytest.fixture
def platform(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    yield platform
    platform.db.dispose()


@pytest.fixture
def counted(monkeypatch):
    """Every database look-up of a key, counted; each takes LOOKUP_S so that others overlap it."""
    calls: list[float] = []
    lock = threading.Lock()
    original = key_lookups.verify_columns

    def slow(platform, authorization):
        with lock:
            calls.append(time.monotonic())
        time.sleep(LOOKUP_S)
        return original(platform, authorization)

    monkeypatch.setattr(key_lookups, "verify_columns", slow)
    return calls


def test_fifty_requests_that_miss_together_share_one_lookup(platform, counted):
    header = f"Bearer {add_tenant(platform, 'alpha')}"
    lookups = key_lookups.KeyLookups(platform)

    async def burst():
        return await asyncio.gather(*(lookups.columns(header) for _ in range(50)))

    answers = asyncio.run(burst())
    assert len(counted) == 1
    assert {api_keys.caller_of(values).tenant_id for values in answers} == \
        {api_keys.caller_of(answers[0]).tenant_id}
    assert api_keys.tenant_of(answers[0]).name == "alpha"
    asyncio.run(burst())  # the entry is fresh now: no look-up at all
    assert len(counted) == 1


def test_a_due_entry_answers_at_once_and_is_reread_once_in_the_background(platform, counted):
    platform.keys = KeyCache(ttl_s=60.0, refresh_after_s=0.0)  # every hit is due for a look-up
    header = f"Bearer {add_tenant(platform, 'alpha')}"
    lookups = key_lookups.KeyLookups(platform)

    async def scenario():
        await lookups.columns(header)  # a miss: waits for the look-up
        assert len(counted) == 1
        answers = await asyncio.gather(*(lookups.columns(header) for _ in range(20)))
        # all twenty were answered while the look-up they started is still running: none waited
        running = list(lookups._running.values())
        assert len(running) == 1 and not running[0].done()
        await asyncio.sleep(LOOKUP_S * 4)  # the background look-up ends
        return answers

    answers = asyncio.run(scenario())
    assert len(answers) == 20
    assert len(counted) == 2  # twenty due hits started one look-up between them


def test_a_key_revoked_elsewhere_is_refused_once_its_background_lookup_ends(platform, counted):
    platform.keys = KeyCache(ttl_s=60.0, refresh_after_s=0.0)
    add_tenant(platform, "alpha")
    with platform.db.session() as session:
        key, secret = tenant_service.create_key(session, "alpha")
        key_id = key.key_id
    header = f"Bearer {secret}"
    lookups = key_lookups.KeyLookups(platform)

    async def scenario():
        await lookups.columns(header)
        with platform.db.session() as session:  # another API process revokes it
            tenant_service.revoke_key(session, "alpha", key_id)
        await lookups.columns(header)  # cached and due: answers, and starts the look-up
        await asyncio.sleep(LOOKUP_S * 4)
        with pytest.raises(ApiError) as refused:
            await lookups.columns(header)  # the look-up dropped the entry: asked again, refused
        return refused.value

    assert asyncio.run(scenario()).status_code == 401


def test_requests_waiting_on_a_lookup_all_get_its_refusal(platform, counted):
    lookups = key_lookups.KeyLookups(platform)

    async def burst():
        return await asyncio.gather(*(lookups.columns("Bearer tf-unknown") for _ in range(10)),
                                    return_exceptions=True)

    answers = asyncio.run(burst())
    assert len(counted) == 1
    assert all(isinstance(answer, ApiError) and answer.status_code == 401 for answer in answers)


def test_a_lookup_that_read_before_a_change_does_not_cache_what_it_read(platform, monkeypatch):
    """forget() runs after an admin change commits: a look-up that read the old row before the
    commit must not store it after the cache was emptied."""
    header = f"Bearer {add_tenant(platform, 'alpha')}"
    cache = KeyCache(ttl_s=60.0)
    original = tenant_repo.key_and_tenant

    def read_then_change(session, api_key):
        found = original(session, api_key)
        cache.forget()  # the change lands while this look-up is between its read and its store
        return found

    monkeypatch.setattr(tenant_repo, "key_and_tenant", read_then_change)
    with platform.db.session() as session:
        assert cache.verify(session, header).name == "alpha"  # this request is answered ...
    assert cache.tenant(header) is None  # ... but nothing was kept
