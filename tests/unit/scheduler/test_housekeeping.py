"""The housekeeping registry: intervals on a fake clock, a failing duty isolated, stable order,
and the scheduler's own duties registered in the order its tick used to run them."""

from __future__ import annotations

import logging

import pytest

from tests.helpers.platform import make_platform
from tuneforge.scheduler.housekeeping import Duty, Housekeeping, platform_duties


class FakeClock:
    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def recording(calls: list[str], name: str):
    return lambda: calls.append(name)


def test_a_duty_runs_at_once_then_once_per_interval() -> None:
    clock, calls = FakeClock(0.0), []
    keeping = Housekeeping([Duty("every_minute", 60.0, recording(calls, "every_minute")),
                            Duty("hourly", 3600.0, recording(calls, "hourly"))], clock=clock)
    assert keeping.run_due() == ["every_minute", "hourly"]  # never run: due at once, even at t=0
    clock.now_s = 59.9
    assert keeping.run_due() == []
    clock.now_s = 60.0
    assert keeping.run_due() == ["every_minute"]
    clock.now_s = 119.0  # counted from when it last ran (60), not from the start
    assert keeping.run_due() == []
    clock.now_s = 3600.0
    assert keeping.run_due() == ["every_minute", "hourly"]
    assert calls == ["every_minute", "hourly", "every_minute", "every_minute", "hourly"]


def test_an_interval_given_as_a_callable_is_read_on_every_pass() -> None:
    clock, calls, interval_s = FakeClock(0.0), [], [30.0]
    keeping = Housekeeping([Duty("sync", lambda: interval_s[0], recording(calls, "sync"))], clock=clock)
    keeping.run_due()
    clock.now_s = 20.0
    interval_s[0] = 10.0  # a setting changed: the next pass uses it
    assert keeping.run_due() == ["sync"]
    assert len(calls) == 2


def test_a_failing_duty_is_logged_under_its_name_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    clock, calls = FakeClock(0.0), []

    def broken() -> None:
        calls.append("broken")
        raise RuntimeError("store unreachable")

    keeping = Housekeeping([Duty("first", 60.0, recording(calls, "first")), Duty("broken", 60.0, broken),
                            Duty("last", 60.0, recording(calls, "last"))], clock=clock)
    with caplog.at_level(logging.ERROR, logger="tuneforge.scheduler"):
        assert keeping.run_due() == ["first", "broken", "last"]
    assert calls == ["first", "broken", "last"]
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1 and failures[0].getMessage() == "housekeeping duty broken failed"
    assert failures[0].exc_info is not None and "store unreachable" in str(failures[0].exc_info[1])
    clock.now_s = 30.0  # a failure counts as a run: retried after its interval, not every tick
    assert keeping.run_due() == []
    clock.now_s = 60.0
    assert keeping.run_due() == ["first", "broken", "last"]


def test_a_duty_that_does_not_apply_is_skipped_and_runs_as_soon_as_it_applies() -> None:
    clock, calls, configured = FakeClock(0.0), [], [False]
    keeping = Housekeeping([Duty("vllm", 60.0, recording(calls, "vllm"), applies=lambda: configured[0])],
                           clock=clock)
    assert keeping.run_due() == []
    clock.now_s = 10.0
    configured[0] = True  # not counted as run while it did not apply: due at once
    assert keeping.run_due() == ["vllm"]
    clock.now_s = 20.0
    assert keeping.run_due() == []


def test_order_is_the_order_registered_whatever_the_names() -> None:
    calls: list[str] = []
    names = ["zeta", "alpha", "mid", "beta"]
    keeping = Housekeeping(clock=FakeClock(0.0))
    for name in names:
        keeping.register(Duty(name, 1.0, recording(calls, name)))
    keeping.run_due()
    assert calls == names and keeping.names == names
    with pytest.raises(ValueError, match="alpha"):
        keeping.register(Duty("alpha", 5.0, recording(calls, "again")))


class ReapingExecutor:
    """Only what the duties ask of an executor: `reap`, recorded."""

    def __init__(self, fails: bool = False) -> None:
        self.reaped: list[set[tuple[str, int]]] = []
        self.fails = fails

    def reap(self, active: set[tuple[str, int]]) -> list[str]:
        self.reaped.append(active)
        if self.fails:
            raise ConnectionError("ray head restarting")
        return []


def test_the_schedulers_duties_keep_their_names_intervals_and_order(tmp_path, database_url) -> None:
    platform = make_platform(tmp_path, database_url, vllm_sync_interval_s=45.0)
    duties = platform_duties(platform, ReapingExecutor())
    intervals_s = [d.interval_s() if callable(d.interval_s) else d.interval_s for d in duties]
    assert list(zip([d.name for d in duties], intervals_s)) == [
        ("purge", 60.0), ("expire", 60.0), ("file_checks", 7.5), ("failed_weights", 60.0),
        ("leftovers", 3600.0), ("routes", 3600.0), ("vllm", 45.0), ("reap", 60.0), ("pools", 30.0),
        ("tenant_purge", 15.0)]
    assert [d.name for d in duties if not d.applies()] == ["vllm"]  # no vLLM server configured


def test_every_duty_runs_against_a_real_database_and_a_failing_reap_is_contained(
        tmp_path, database_url, caplog: pytest.LogCaptureFixture) -> None:
    platform = make_platform(tmp_path, database_url)
    executor = ReapingExecutor(fails=True)
    keeping = Housekeeping(platform_duties(platform, executor), clock=FakeClock(1_000.0))
    with caplog.at_level(logging.ERROR, logger="tuneforge.scheduler"):
        ran = keeping.run_due()
    assert ran == ["purge", "expire", "file_checks", "failed_weights", "leftovers", "routes", "reap", "pools",
                   "tenant_purge"]
    assert executor.reaped == [set()]  # no attempt is active, so nothing is kept
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "housekeeping duty reap failed"]
