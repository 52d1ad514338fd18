"""What graders ask over HTTP: model graders' judges and the cosine metric's embeddings.

Judges (`score_model`, `label_model`) are asked by the control plane, never by
a trainer with a credential of its own (`services/serving/judges.py` decides
who answers and meters the tokens; a trainer sends its conversations there,
`train/judges.py`). Two kinds are asked over HTTP, from here:

- the operator's endpoints (`TUNEFORGE_EVAL_ENDPOINTS`, the same the LLM-judge
  eval metric uses), named by the grader's `model`; their URL and key never
  reach the tenant;
- the tenant's own OpenAI-compatible endpoint (the grader's `endpoint`, an
  extension, with its key in the tenant secret `api_key_secret`), through the
  egress policy at connect time.

A batch's conversations are asked side by side (`JUDGE_CONCURRENCY` at once);
the request carries the grader's sampling parameters; each answer's
`usage.total_tokens` is what the grader reports as spent.

Embeddings (`text_similarity` with `cosine`): the operator's endpoint named by
`TUNEFORGE_GRADER_EMBEDDINGS` (one of the same endpoints), asked
`POST {url}/embeddings` for the sample's and the reference's vectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tuneforge.eval.openai_chat import ChatEndpoint, ChatEndpointError, Credentials, ask, open_client
from tuneforge.graders.score import JudgeError, JudgeReply

MAX_EMBEDDING_DIMENSIONS = 65_536
JUDGE_CONCURRENCY = 8  # one batch's requests in flight to one endpoint

_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "seed": "seed",
             "max_completions_tokens": "max_completion_tokens"}


def endpoint_target(grader: Any, endpoints: Mapping[str, Mapping[str, str]],
                    secrets: Mapping[str, str]) -> ChatEndpoint | None:
    """The HTTP endpoint that judges for `grader`, bound to its URL and key: the tenant's own
    (`endpoint`) or the operator's it names; None when its judge is not asked over HTTP."""
    if grader.endpoint is not None:
        target = ChatEndpoint(grader.endpoint, grader.model, grader.api_key_secret)
    elif endpoints.get(grader.model, {}).get("url"):
        target = ChatEndpoint(None, None, endpoint_name=grader.model)
    else:
        return None
    try:
        return target.bind(Credentials(secrets=secrets, endpoints=endpoints))
    except ChatEndpointError as exc:
        raise JudgeError(str(exc)) from None


def ask_many(target: ChatEndpoint, conversations: list[list[dict[str, str]]], sampling: Mapping[str, Any], *,
             client: httpx.Client | None = None) -> list[JudgeReply | JudgeError]:
    """Each conversation's answer from `target` (or its error), asked side by side; `client`: the
    caller's (for a tenant's URL, one through the egress policy), else `open_client`'s."""
    options = {ours: sampling[theirs] for theirs, ours in _SAMPLING.items() if sampling.get(theirs) is not None}

    def one(messages: list[dict[str, str]]) -> JudgeReply | JudgeError:
        try:
            reply = ask(target, messages, options=options, client=http)
        except ChatEndpointError as exc:
            return JudgeError(str(exc))
        return JudgeReply(reply.text, reply.tokens, reply.refused, reply.completion_tokens)

    http = client if client is not None else open_client(target)
    try:
        with ThreadPoolExecutor(max(1, min(JUDGE_CONCURRENCY, len(conversations))), "judge") as pool:
            return list(pool.map(one, conversations))
    finally:
        if client is None:
            http.close()


class EndpointEmbeddings:
    """The cosine metric's vectors from the operator's OpenAI-compatible `/embeddings` endpoint."""

    def __init__(self, name: str, offered: Mapping[str, str]) -> None:
        self.target = ChatEndpoint(None, None, endpoint_name=name).bind(Credentials(endpoints={name: dict(offered)}))

    def embed(self, texts: list[str]) -> list[list[float]]:
        url = (self.target.endpoint or "").rstrip("/") + "/embeddings"
        headers = {"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else {}
        try:
            with open_client(self.target) as http:
                response = http.post(url, json={"model": self.target.model, "input": texts}, headers=headers,
                                     timeout=self.target.timeout_s)
        except httpx.HTTPError as exc:
            raise JudgeError(f"the embeddings endpoint could not be reached ({type(exc).__name__})") from None
        if response.status_code >= 300:
            raise JudgeError(f"the embeddings endpoint answered HTTP {response.status_code}")
        try:
            rows = sorted(response.json()["data"], key=lambda row: row["index"])
            vectors = [[float(x) for x in row["embedding"][:MAX_EMBEDDING_DIMENSIONS]] for row in rows]
        except (ValueError, KeyError, TypeError):
            raise JudgeError("the embeddings endpoint answered without data[].embedding") from None
        if len(vectors) != len(texts):
            raise JudgeError(f"the embeddings endpoint answered {len(vectors)} vectors for {len(texts)} texts")
        return vectors


def embeddings_for(name: str | None, endpoints: Mapping[str, Mapping[str, str]]) -> EndpointEmbeddings | None:
    """The embeddings of the endpoint `name`, when it is one of `endpoints`."""
    if not name or not endpoints.get(name, {}).get("url"):
        return None
    return EndpointEmbeddings(name, endpoints[name])


def uses_cosine(grader: Any) -> bool:
    from tuneforge.domain.graders import sub_graders

    return any(getattr(sub, "evaluation_metric", None) == "cosine" for sub in sub_graders(grader).values())
