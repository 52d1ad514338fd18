"""The judge of model graders (`score_model`, `label_model`): the operator's endpoints, by name.

A model grader's `model` names one of the endpoints the operator offers
(`TUNEFORGE_EVAL_ENDPOINTS`, the same the LLM-judge eval metric uses); the
endpoint's URL and key never reach the tenant. The control plane asks it for
`graders/run`; a trainer gets the endpoints its grader names from the control
plane with its job token (`train/credentials.py`) and asks them itself. The
request carries the grader's sampling parameters; the answer's
`usage.total_tokens` is what the grader reports as spent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneforge.eval.openai_chat import ChatEndpoint, ChatEndpointError, Credentials, ask
from tuneforge.graders.score import JudgeError, JudgeReply

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
