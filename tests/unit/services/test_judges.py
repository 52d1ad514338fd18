"""The control plane's judges on the built-in engine (services/serving/judges.py): a batch asks side by
side as far as the tenant's tokens in flight allow and waits for its own answers for the rest."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tuneforge.domain.errors import ApiError, rate_limited
from tuneforge.graders.score import JudgeError, JudgeReply
from tuneforge.serve.params import Completion, SamplingParams, Usage
from tuneforge.services.serving.judges import TenantJudges


class Sink:
    def __init__(self, engine: Engine, text: str) -> None:
        self.engine, self.text = engine, text

    def completion(self) -> Completion:
        self.engine.running -= 1
        if self.text == "boom":
            raise ApiError(503, "The model is unavailable", code="engine_unavailable")
        return Completion(f"answer to {self.text}", "stop", Usage(prompt_tokens=5, completion_tokens=2))


class Engine:
    """At most `room` generations at once; one more is the budget's 429."""

    def __init__(self, room: int) -> None:
        self.room, self.running, self.most, self.seeds = room, 0, 0, []

    def for_tenant(self, tenant: str, tokens_in_flight: int) -> Engine:
        assert (tenant, tokens_in_flight) == ("tenant-1", 4096)
        return self

    def submit(self, target: Any, prompt: Any, params: SamplingParams) -> Sink:
        text = prompt.messages[0]["content"]
        if text == "too long":
            raise ApiError(400, "The prompt is longer than the model's context", code="context_length_exceeded")
        if self.running == self.room:
            raise rate_limited("too many tokens in flight", retry_after=1)
        self.running += 1
        self.most = max(self.most, self.running)
        self.seeds.append(params.seed)
        return Sink(self, text)


def test_a_batch_waits_for_room_and_each_failure_is_its_samples_own() -> None:
    engine = Engine(room=2)
    settings = SimpleNamespace(inference_tokens_in_flight_for=lambda tier: 4096)
    judges = TenantJudges(SimpleNamespace(inference=engine, settings=settings), "tenant-1", "default")
    texts = ["a", "b", "too long", "c", "boom", "d"]
    replies = judges._on_engine(None, [[{"role": "user", "content": t}] for t in texts],
                                SamplingParams(max_new_tokens=8, seed=10))
    assert engine.most == 2 and engine.running == 0  # never over the tenant's room, all answered
    assert [r.text if isinstance(r, JudgeReply) else None for r in replies] == \
        ["answer to a", "answer to b", None, "answer to c", None, "answer to d"]
    assert all(r.tokens == 7 and r.completion_tokens == 2 for r in replies if isinstance(r, JudgeReply))
    assert isinstance(replies[2], JudgeError) and "context" in str(replies[2])
    assert isinstance(replies[4], JudgeError) and "unavailable" in str(replies[4])
    assert sorted(engine.seeds) == [10, 11, 13, 14, 15]  # each conversation its own seed
