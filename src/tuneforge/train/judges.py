"""Model graders' judges as a trainer asks them: through its control plane.

The trainer renders each sample's conversation (its grader's templates) and
sends a batch to `POST /internal/v1/jobs/{id}/judge` with its job token; the
control plane asks the judge the job's grader names, with the grader's own
sampling (services/serving/judges.py), and meters the tokens to the job. The
trainer never holds a judge's URL or key and can ask nothing else.

A busy control plane or judge (429, 503) is waited for as its Retry-After
says, up to `PATIENCE_S` per batch; after that, or on any other failure, every
sample of the batch gets the judge's error (it scores 0 with its flag).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

from tuneforge.domain.graders import judges
from tuneforge.graders.score import JudgeError, JudgeReply
from tuneforge.security.tls import verified_context

BATCH = 512  # conversations per request: the control plane's bound (services/training/reports.py)
MAX_MESSAGE_CHARS = 262_144  # of one message: the control plane's bound
BATCH_CHARS = 2_000_000  # of one request's text: well within the API's bound on a body, escaped
PATIENCE_S = 300.0
_TIMEOUT = httpx.Timeout(connect=30.0, read=900.0, write=60.0, pool=30.0)


class ControlPlaneJudge:
    def __init__(self, spec: Any, grader: Any, *, client: httpx.Client | None = None) -> None:
        self.spec = spec
        self.names = judges(grader)
        self.client = client

    def check(self, grader: Any, where: str) -> None:
        """The control plane checked the judges when the job was created."""

    def complete_many(self, grader: Any, conversations: list[list[dict[str, str]]], *, sampling: Mapping[str, Any],
                      schema: Mapping[str, Any]) -> list[JudgeReply | JudgeError]:
        name = next((name for name, sub in self.names.items() if sub is grader or sub == grader), None)
        if name is None:
            return [JudgeError("this grader is not one of the job's") for _ in conversations]
        replies: list[JudgeReply | JudgeError] = [JudgeError("not asked")] * len(conversations)
        for batch in _batches(conversations, replies):
            for index, reply in zip(batch, self._batch(name, [conversations[index] for index in batch])):
                replies[index] = reply
        return replies

    def _batch(self, name: str, conversations: list[list[dict[str, str]]]) -> list[JudgeReply | JudgeError]:
        url = f"{self.spec.callback_url.rstrip('/')}/internal/v1/jobs/{self.spec.job_id}/judge"
        body = {"attempt": self.spec.attempt, "grader": name, "conversations": conversations}
        deadline = time.monotonic() + PATIENCE_S
        http = self.client or httpx.Client(timeout=_TIMEOUT, trust_env=False, verify=verified_context())
        try:
            while True:
                try:
                    response = http.post(url, json=body, headers={"Authorization": f"Bearer {self.spec.job_token}"})
                except httpx.HTTPError as exc:
                    return _failed(f"the control plane could not be reached for the judge ({type(exc).__name__})",
                                   conversations)
                wait = _retry_after(response)
                if response.status_code in (429, 503) and time.monotonic() + wait < deadline:
                    time.sleep(wait)
                    continue
                break
        finally:
            if self.client is None:
                http.close()
        if response.status_code != 200:
            return _failed(f"the judge was not asked (HTTP {response.status_code})", conversations)
        try:
            rows = response.json()["replies"]
            assert isinstance(rows, list) and len(rows) == len(conversations)
            return [JudgeError(str(row["error"])) if "error" in row else
                    JudgeReply(str(row["text"]), int(row["tokens"]), bool(row.get("refused")),
                               int(row.get("completion_tokens") or 0)) for row in rows]
        except (ValueError, KeyError, TypeError, AssertionError):
            return _failed("the control plane answered the judge request without its replies", conversations)


def _batches(conversations: list[list[dict[str, str]]], replies: list[JudgeReply | JudgeError]) -> list[list[int]]:
    """The conversations' indices in requests the control plane takes (at most `BATCH` of them and
    `BATCH_CHARS` of text each); one with a message over `MAX_MESSAGE_CHARS` gets its error in
    `replies` and is not sent."""
    batches: list[list[int]] = [[]]
    size = 0
    for index, conversation in enumerate(conversations):
        if any(len(message["content"]) > MAX_MESSAGE_CHARS for message in conversation):
            replies[index] = JudgeError(f"the judge's prompt has a message over {MAX_MESSAGE_CHARS} characters")
            continue
        chars = sum(len(message["content"]) + 32 for message in conversation)
        if batches[-1] and (len(batches[-1]) == BATCH or size + chars > BATCH_CHARS):
            batches.append([])
            size = 0
        batches[-1].append(index)
        size += chars
    return [batch for batch in batches if batch]


def _failed(message: str, conversations: list[Any]) -> list[JudgeReply | JudgeError]:
    return [JudgeError(message) for _ in conversations]


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(60.0, max(0.5, float(response.headers.get("retry-after", 2))))
    except ValueError:
        return 2.0
