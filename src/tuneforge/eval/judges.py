"""What graders ask elsewhere: model graders' judges and the cosine metric's embeddings.

Judges (`score_model`, `label_model`): the operator's endpoints, by name.

A model grader's `model` names one of the endpoints the operator offers
(`TUNEFORGE_EVAL_ENDPOINTS`, the same the LLM-judge eval metric uses); the
endpoint's URL and key never reach the tenant. The control plane asks it for
`graders/run`; a trainer gets the endpoints its grader names from the control
plane with its job token (`train/credentials.py`) and asks them itself. The
request carries the grader's sampling parameters; the answer's
`usage.total_tokens` is what the grader reports as spent.

Embeddings (`text_similarity` with `cosine`): the operator's endpoint named by
`TUNEFORGE_GRADER_EMBEDDINGS` (one of the same endpoints), asked
`POST {url}/embeddings` for the sample's and the reference's vectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from tuneforge.eval.openai_chat import ChatEndpoint, ChatEndpointError, Credentials, ask, open_client
from tuneforge.graders.score import JudgeError, JudgeReply

MAX_EMBEDDING_DIMENSIONS = 65_536

_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "seed": "seed",
             "max_completions_tokens": "max_completion_tokens"}


class EndpointJudge:
    def __init__(self, endpoints: Mapping[str, Mapping[str, str]]) -> None:
        self.endpoints = {name: dict(offered) for name, offered in endpoints.items()}

    def offers(self, model: str) -> bool:
        return bool(self.endpoints.get(model, {}).get("url"))

    def names(self) -> list[str]:
        return sorted(name for name in self.endpoints if self.offers(name))

    def complete(self, model: str, messages: list[dict[str, str]], *, sampling: Mapping[str, Any],
                 schema: Mapping[str, Any] | None) -> JudgeReply:
        try:
            target = ChatEndpoint(None, None, endpoint_name=model).bind(Credentials(endpoints=self.endpoints))
            options = {ours: sampling[theirs] for theirs, ours in _SAMPLING.items() if sampling.get(theirs) is not None}
            reply = ask(target, messages, options=options)
        except ChatEndpointError as exc:
            raise JudgeError(str(exc)) from None
        return JudgeReply(reply.text, reply.tokens, reply.refused)


def judged_models(grader: Any) -> set[str]:
    """The judges a grader's model graders name."""
    from tuneforge.domain.graders import sub_graders

    return {sub.model for sub in sub_graders(grader).values() if sub.type in ("score_model", "label_model")}


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
