"""The SQL storage of the API's rate-limit counters, on the test's database (SQLite, or PostgreSQL
in the PostgreSQL pass): exact counts under concurrent writers, windows, cleanup, and `limits`'s
own fixed-window strategy on top of it."""

from __future__ import annotations

import threading

import pytest
from limits import RateLimitItemPerHour, RateLimitItemPerMinute
from limits.storage import storage_from_string
from limits.strategies import FixedWindowRateLimiter

from tuneforge.db.ratelimit_storage import (
    CLEANUP_INTERVAL_S,
    SqlStorage,
    check_storage_uri,
    sqlalchemy_url,
    storage_uri_for_database,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def open_storage(database_url):
    """`open_storage(clock=None)`: a storage on this test's database; closed after the test."""
    opened: list[SqlStorage] = []

    def open_(clock: Clock | None = None) -> SqlStorage:
        storage = storage_from_string(storage_uri_for_database(database_url), clock=clock)
        assert isinstance(storage, SqlStorage)
        opened.append(storage)
        return storage

    yield open_
    for storage in opened:
        storage.close()


def _rows(storage: SqlStorage) -> int:
    with storage._cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM rate_limit_counters")
        return cursor.fetchone()[0]


def test_concurrent_hits_are_counted_exactly(open_storage):
    # two storages on one database stand for two API processes, four threads each
    storages = [open_storage(), open_storage()]
    limiters = [FixedWindowRateLimiter(storage) for storage in storages]
    item = RateLimitItemPerHour(100)
    allowed: list[int] = []
    start = threading.Barrier(8)

    def hammer(limiter: FixedWindowRateLimiter) -> None:
        start.wait()
        allowed.append(sum(limiter.hit(item, "tenant-a") for _ in range(50)))

    threads = [threading.Thread(target=hammer, args=(limiters[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(allowed) == 100
    assert storages[0].get(item.key_for("tenant-a")) == 400  # every hit counted, allowed or not
    assert limiters[1].get_window_stats(item, "tenant-a").remaining == 0
    assert limiters[0].hit(item, "tenant-b")  # another key has its own count


def test_a_window_ends_and_the_next_hit_starts_a_new_one(open_storage):
    clock = Clock()
    storage = open_storage(clock)
    assert storage.incr_with_expiry("k", 10) == (1, clock.now + 10)
    clock.now += 4
    assert storage.incr_with_expiry("k", 10, amount=2) == (3, 1_800_000_010.0)  # same window
    assert storage.get("k") == 3 and storage.get_expiry("k") == 1_800_000_010.0
    clock.now += 6  # the window has ended
    assert storage.get("k") == 0 and storage.get_expiry("k") == clock.now
    assert storage.incr("k", 10) == 1
    assert storage.get_expiry("k") == clock.now + 10


def test_limits_fixed_window_strategy_runs_on_it(open_storage):
    clock = Clock()
    limiter = FixedWindowRateLimiter(open_storage(clock))
    item = RateLimitItemPerMinute(3)
    assert [limiter.hit(item, "t") for _ in range(4)] == [True, True, True, False]
    assert not limiter.test(item, "t")
    stats = limiter.get_window_stats(item, "t")
    assert stats.remaining == 0 and stats.reset_time == clock.now + 60
    clock.now += 60
    assert limiter.test(item, "t") and limiter.hit(item, "t")
    limiter.clear(item, "t")
    assert limiter.get_window_stats(item, "t").remaining == 3


def test_rows_of_ended_windows_are_deleted(open_storage):
    clock = Clock()
    storage = open_storage(clock)
    for n in range(50):
        storage.incr(f"tenant-{n}", 1)
    assert _rows(storage) == 50
    clock.now += 0.5
    assert storage.delete_expired() == 0  # all still live
    clock.now += CLEANUP_INTERVAL_S
    storage.incr("tenant-0", 1)  # the first hit a minute later sweeps the table
    assert _rows(storage) == 1
    assert storage.get("tenant-0") == 1


def test_reset_clear_and_check(open_storage):
    storage = open_storage()
    for key in ("a", "b", "c"):
        storage.incr(key, 60)
    storage.clear("b")
    assert (storage.get("a"), storage.get("b")) == (1, 0)
    assert storage.reset() == 2
    assert storage.get("a") == 0
    assert storage.check()


def test_the_table_is_created_once_for_every_process(open_storage):
    first, second = open_storage(), open_storage()  # the second finds the table there
    first.incr("shared", 60)
    assert second.get("shared") == 1


def test_uris():
    assert sqlalchemy_url("tuneforge+sqlite:////var/lib/tf/ratelimit.db") == "sqlite:////var/lib/tf/ratelimit.db"
    assert sqlalchemy_url("tuneforge+sqlite:///home/ratelimit.db") == "sqlite:///home/ratelimit.db"  # relative
    assert sqlalchemy_url("tuneforge+postgresql://u:p@db/tf") == "postgresql+psycopg://u:p@db/tf"
    assert sqlalchemy_url("tuneforge+postgresql+psycopg://u:p@db/tf") == "postgresql+psycopg://u:p@db/tf"
    assert storage_uri_for_database("sqlite:////x/tuneforge.db") == "tuneforge+sqlite:////x/tuneforge.db"
    assert storage_uri_for_database("postgresql+psycopg://u@db/tf") == "tuneforge+postgresql://u@db/tf"
    for good in ("memory://", "database", "tuneforge+sqlite:////x/r.db", "redis://cache:6379"):
        check_storage_uri(good)
    for bad in ("tuneforge+sqlite://", "tuneforge+sqlite:///:memory:", "async+redis://cache", "ftp://x"):
        with pytest.raises(ValueError, match="TUNEFORGE_RATE_LIMIT_STORAGE"):
            check_storage_uri(bad)
