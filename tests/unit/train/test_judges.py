"""A trainer's model graders ask their judges through the control plane (train/judges.py): batches
within the control plane's bounds, its busy answers waited for, every failure a sample's error."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tuneforge.graders import check
from tuneforge.graders.score import JudgeError, JudgeReply
from tuneforge.train import judges

SPEC = SimpleNamespace(callback_url="http://plane:8000/", job_id="ftjob-1", attempt=2, job_token="job-token")
PROMPT = [{"role": "user", "content": "{{sample.output_text}}"}]
GRADER = check.parse({"type": "multi", "name": "m", "calculate_output": "a + b", "graders": {
    "a": {"type": "score_model", "name": "a", "model": "tiny-chat", "input": PROMPT},
    "b": {"type": "label_model", "name": "b", "model": "tiny-chat", "input": PROMPT, "labels": ["x", "y"],
          "passing_labels": ["x"]}}}, "grader")


def conversation(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


class Plane:
    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append({"url": str(request.url), "auth": request.headers["authorization"], "body": body})
        status = self.statuses.pop(0) if self.statuses else 200
        if status != 200:
            return httpx.Response(status, headers={"Retry-After": "0.01"}, json={"error": {"message": "busy"}})
        return httpx.Response(200, json={"replies": [
            {"text": f'{{"result": "{c[0]["content"]}"}}', "tokens": 10, "completion_tokens": 3, "refused": False}
            if c[0]["content"] != "fail" else {"error": "the judge failed: overloaded"}
            for c in body["conversations"]]})


def judge_with(plane: Plane) -> judges.ControlPlaneJudge:
    return judges.ControlPlaneJudge(SPEC, GRADER, client=httpx.Client(transport=httpx.MockTransport(plane)))


def test_a_batch_is_sent_with_the_job_token_naming_the_sub_grader_and_read_back_in_order() -> None:
    plane = Plane(429, 503)  # busy twice: waited for, then answered
    replies = judge_with(plane).complete_many(GRADER.graders["b"], [conversation("x"), conversation("fail")],
                                              sampling={}, schema={})
    assert replies[0] == JudgeReply('{"result": "x"}', 10, False, 3)
    assert isinstance(replies[1], JudgeError) and "overloaded" in str(replies[1])
    assert len(plane.requests) == 3
    sent = plane.requests[-1]
    assert sent["url"] == "http://plane:8000/internal/v1/jobs/ftjob-1/judge" and sent["auth"] == "Bearer job-token"
    assert sent["body"] == {"attempt": 2, "grader": "b", "conversations": [conversation("x"), conversation("fail")]}


def test_batches_stay_within_the_control_planes_bounds(monkeypatch) -> None:
    monkeypatch.setattr(judges, "BATCH", 2)
    plane = Plane()
    huge = conversation("z" * (judges.MAX_MESSAGE_CHARS + 1))
    replies = judge_with(plane).complete_many(GRADER.graders["a"], [conversation(str(n)) for n in range(3)]
                                              + [huge] + [conversation(str(n)) for n in range(3, 5)],
                                              sampling={}, schema={})
    assert [len(r["body"]["conversations"]) for r in plane.requests] == [2, 2, 1]
    assert isinstance(replies[3], JudgeError) and "over 262144 characters" in str(replies[3])
    assert [json.loads(r.text)["result"] for i, r in enumerate(replies) if i != 3] == ["0", "1", "2", "3", "4"]
    monkeypatch.setattr(judges, "BATCH_CHARS", 10)
    plane = Plane()
    judge_with(plane).complete_many(GRADER.graders["a"], [conversation("hello")] * 3, sampling={}, schema={})
    assert len(plane.requests) == 3  # each one alone is over the bound: one per request


@pytest.mark.parametrize("status", [400, 401, 409, 500])
def test_a_refused_request_is_every_samples_error(status: int) -> None:
    replies = judge_with(Plane(status)).complete_many(GRADER.graders["a"], [conversation("x")] * 2,
                                                      sampling={}, schema={})
    assert all(isinstance(r, JudgeError) and f"HTTP {status}" in str(r) for r in replies)


def test_a_grader_that_is_not_the_jobs_is_not_asked() -> None:
    plane = Plane()
    other = check.parse({"type": "score_model", "name": "a", "model": "elsewhere", "input": PROMPT}, "grader")
    replies = judge_with(plane).complete_many(other, [conversation("x")], sampling={}, schema={})
    assert plane.requests == [] and isinstance(replies[0], JudgeError)
