"""The pairwise LLM judge against a real HTTP endpoint on 127.0.0.1: the position swap
cancels a judge's position bias, a judge preferring the fine-tuned answer gives 1.0,
and every way the endpoint can fail is a JudgeError naming it."""

from __future__ import annotations

import re
import socket

import httpx
import pytest

from tuneforge.eval import metrics
from tuneforge.eval.metrics import JudgeError, LlmJudge
from tuneforge.eval.openai_chat import Credentials

BASE, TUNED = "Rome is the capital.", "TUNED: Paris is the capital."


def _judge(url: str, **options: object) -> LlmJudge:
    return metrics.parse_metrics([{"type": "llm_judge", "endpoint": url, "model": "judge", **options}])[0]


def _answers(text: str) -> tuple[str, str]:
    found = re.search(r"Answer A:\n(.*)\n\nAnswer B:\n(.*)\Z", text, re.DOTALL)
    assert found, text
    return found.group(1), found.group(2)


def _prefers(marker: str | None):
    """A judge that picks the answer containing `marker` (None: the other one)."""
    def respond(body: dict) -> tuple[int, str]:
        first, _second = _answers(body["messages"][-1]["content"])
        if marker is None:
            return 200, "A" if "TUNED" not in first else "B"
        return 200, "A" if marker in first else "B"
    return respond


def _win_rate(spec: LlmJudge, examples: int = 4) -> float:
    scores = [metrics.judge_pairwise(spec, "What is the capital of France?", "Paris", BASE, TUNED)
              for _ in range(examples)]
    return sum(scores) / len(scores)


def test_a_judge_preferring_the_fine_tuned_answer_gives_1_and_asks_twice_with_positions_swapped(chat_stub):
    chat_stub.respond = _prefers("TUNED")
    assert metrics.judge_pairwise(_judge(chat_stub.url), "What is the capital of France?", "Paris",
                                  BASE, TUNED) == 1.0
    assert len(chat_stub.requests) == 2
    assert chat_stub.paths == ["/v1/chat/completions"] * 2
    assert _answers(chat_stub.user_text(0)) == (BASE, TUNED)
    assert _answers(chat_stub.user_text(1)) == (TUNED, BASE)
    first = chat_stub.requests[0]
    assert first["model"] == "judge" and first["temperature"] == 0
    assert first["messages"][0]["role"] == "system" and "exactly one word" in first["messages"][0]["content"]
    assert "Question:\nWhat is the capital of France?" in chat_stub.user_text(0)
    assert "Reference answer:\nParis" in chat_stub.user_text(0)
    assert "authorization" not in {k.lower() for k in chat_stub.headers[0]}


def test_a_judge_preferring_the_base_answer_gives_0(chat_stub):
    chat_stub.respond = _prefers(None)
    assert _win_rate(_judge(chat_stub.url)) == 0.0


@pytest.mark.parametrize("verdict", ["A", "B", "TIE"])
def test_position_bias_cancels_out(chat_stub, verdict):
    chat_stub.respond = lambda body: (200, verdict)
    assert _win_rate(_judge(chat_stub.url)) == 0.5
    assert len(chat_stub.requests) == 8


def test_split_verdicts_score_half(chat_stub):
    replies = iter(["B", "TIE"])  # tuned wins as B, then a tie with tuned as A
    chat_stub.respond = lambda body: (200, next(replies))
    assert metrics.judge_pairwise(_judge(chat_stub.url), "q", None, BASE, TUNED) == 0.5
    assert "Reference answer" not in chat_stub.user_text(0)


def test_an_unparseable_reply_counts_as_a_tie_and_is_recorded(chat_stub, caplog):
    replies = iter(["B", "I cannot decide between them."])
    chat_stub.respond = lambda body: (200, next(replies))
    judgement = metrics.judge_both_orders(_judge(chat_stub.url), "q", "r", BASE, TUNED)
    assert (judgement.verdict_base_first, judgement.verdict_tuned_first) == ("B", "TIE")
    assert judgement.unparseable == 1 and judgement.score == 0.5
    assert judgement.replies == ("B", "I cannot decide between them.")
    assert "no A/B/TIE verdict" in caplog.text


def test_criteria_and_api_key_are_sent(chat_stub):
    chat_stub.respond = _prefers("TUNED")
    spec = _judge(chat_stub.url + "/", api_key_secret="JUDGE_KEY", criteria="Prefer the correct city.")
    spec = LlmJudge(spec.target.bind(Credentials(secrets={"JUDGE_KEY": "sk-judge"})), spec.criteria)
    assert metrics.judge_pairwise(spec, "q", "Paris", BASE, TUNED) == 1.0
    assert chat_stub.headers[0]["Authorization"] == "Bearer sk-judge"
    assert "Criteria:\nPrefer the correct city." in chat_stub.user_text(0)
    assert chat_stub.paths[0] == "/v1/chat/completions"


def test_an_unbound_secret_is_a_judge_error_and_nothing_is_sent(chat_stub):
    with pytest.raises(JudgeError, match="secret 'JUDGE_KEY'"):
        metrics.judge_pairwise(_judge(chat_stub.url, api_key_secret="JUDGE_KEY"), "q", "r", BASE, TUNED)
    assert chat_stub.requests == []


def test_an_operator_endpoint_is_bound_by_name(chat_stub):
    chat_stub.respond = _prefers("TUNED")
    spec = metrics.parse_metrics([{"type": "llm_judge", "endpoint_name": "house-judge"}])[0]
    offered = {"house-judge": {"url": chat_stub.url, "model": "judge-70b", "api_key": "sk-operator"}}
    spec = LlmJudge(spec.target.bind(Credentials(endpoints=offered)), spec.criteria)
    assert metrics.judge_pairwise(spec, "q", "Paris", BASE, TUNED) == 1.0
    assert chat_stub.headers[0]["Authorization"] == "Bearer sk-operator"
    with pytest.raises(JudgeError, match="'house-judge'") as caught:  # errors name it, never its URL
        chat_stub.respond = lambda body: (503, "busy")
        metrics.judge_pairwise(spec, "q", "r", BASE, TUNED)
    assert chat_stub.url not in str(caught.value)


def test_a_loopback_judge_is_refused_without_the_allow_list(chat_stub, monkeypatch):
    monkeypatch.setenv("TUNEFORGE_EGRESS_ALLOW", "")
    with pytest.raises(JudgeError, match="not allowed"):
        metrics.judge_pairwise(_judge(chat_stub.url), "q", "r", BASE, TUNED)
    assert chat_stub.requests == []


def test_http_500_is_a_judge_error_naming_endpoint_and_status_but_not_the_body(chat_stub):
    chat_stub.respond = lambda body: (500, "model crashed")
    with pytest.raises(JudgeError) as caught:
        metrics.judge_pairwise(_judge(chat_stub.url), "q", "r", BASE, TUNED)
    message = str(caught.value)
    assert f"{chat_stub.url}/chat/completions" in message and "HTTP 500" in message
    assert "model crashed" not in message  # an endpoint's reply never comes back to the tenant


def test_a_timeout_is_a_judge_error(chat_stub):
    chat_stub.delay_s = 1.0
    with pytest.raises(JudgeError, match=r"did not answer within 0\.2 s") as caught:
        metrics.judge_pairwise(_judge(chat_stub.url, timeout_s=0.2), "q", "r", BASE, TUNED)
    assert chat_stub.url in str(caught.value)


def test_an_unreachable_endpoint_is_a_judge_error():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(JudgeError, match=f"127.0.0.1:{port}/v1/chat/completions could not be reached"):
        metrics.judge_pairwise(_judge(f"http://127.0.0.1:{port}/v1"), "q", "r", BASE, TUNED)


def test_an_answer_without_content_is_a_judge_error():
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"choices": []}))
    with httpx.Client(transport=transport) as client, pytest.raises(JudgeError, match="choices"):
        metrics.judge_pairwise(_judge("http://judge.invalid/v1"), "q", "r", BASE, TUNED, client=client)


def test_an_injected_client_is_used():
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "A"}}]})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        assert metrics.judge_pairwise(_judge("http://judge.invalid/v1"), "q", "r", BASE, TUNED, client=client) == 0.5
    assert seen == ["http://judge.invalid/v1/chat/completions"] * 2
