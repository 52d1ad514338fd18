"""services.queue.queue_as_of: the queue is computed once per change (not once per waiting request),
and an old-but-unchanged queue answers while one caller refreshes it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tuneforge.services.context import QueueMemo
from tuneforge.services.training import queue as queue_service


def _platform() -> SimpleNamespace:
    return SimpleNamespace(queue=QueueMemo())


def test_many_callers_after_a_change_compute_the_queue_once(monkeypatch):
    computed: list[int] = []
    release = threading.Event()

    def slow_queue(session, platform, now):  # noqa: ANN001
        computed.append(1)
        release.wait(5)
        return [f"queue {len(computed)}"]

    monkeypatch.setattr(queue_service, "whole_queue", slow_queue)
    platform = _platform()
    answers: list[list[str]] = []
    threads = [threading.Thread(target=lambda: answers.append(queue_service.queue_as_of(platform, 7, session=object())))
               for _ in range(20)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # all of them have asked by now; one computes, the others wait for it
    release.set()
    for thread in threads:
        thread.join(5)
    assert len(computed) == 1
    assert answers == [["queue 1"]] * 20
    # another change: computed again, once
    assert queue_service.queue_as_of(platform, 8, session=object()) == ["queue 2"]


def test_an_old_unchanged_queue_answers_while_one_caller_refreshes_it(monkeypatch):
    refreshing = threading.Event()
    release = threading.Event()

    def slow_queue(session, platform, now):  # noqa: ANN001
        refreshing.set()
        release.wait(5)
        return ["fresh"]

    monkeypatch.setattr(queue_service, "whole_queue", slow_queue)
    platform = _platform()
    platform.queue = QueueMemo(7, time.time() - queue_service.QUEUE_MEMO_S - 0.5, ["old"])
    refresher = threading.Thread(target=lambda: queue_service.queue_as_of(platform, 7, session=object()))
    refresher.start()
    assert refreshing.wait(5)
    assert queue_service.queue_as_of(platform, 7, session=object()) == ["old"]  # no wait behind the refresh
    release.set()
    refresher.join(5)
    assert queue_service.queue_as_of(platform, 7, session=object()) == ["fresh"]
    # a changed queue is never answered from the old one: the caller waits for the new one
    assert platform.queue.newest_event == 7
    release.clear()
    monkeypatch.setattr(queue_service, "whole_queue", lambda session, platform, now: ["after the change"])
    assert queue_service.queue_as_of(platform, 9, session=object()) == ["after the change"]
