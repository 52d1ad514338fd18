"""Model graders' judges, asked by the control plane for one tenant, every answer's tokens metered.

Who judges a model grader (`score_model`, `label_model`), in this order:

1. its `endpoint` (an extension): the tenant's own OpenAI-compatible API,
   through the egress policy, with the tenant secret `api_key_secret` as its key;
2. its `model` naming an endpoint the operator offers (TUNEFORGE_EVAL_ENDPOINTS);
3. its `model` naming a model this platform serves the tenant: a registered
   base model, one of its own `ft:` models or a checkpoint of its jobs,
   answered by a vLLM server where the base has one and the model is deployed
   there, else by the built-in engine under the tenant's bound on tokens in
   flight (a batch waits for room; it does not fail for it).

Anything else is refused when the grader is checked: a 400 naming the
grader's `model`, `endpoint` or `api_key_secret`. `graders/run` asks here in
the API's thread pool. A trainer sends its rendered conversations to the
control plane (`POST /internal/v1/jobs/{id}/judge`), which asks here with the
job's own grader: a trainer holds no judge's URL or key, and can ask nothing
its job's grader does not name.

Each batch's tokens are metered to the tenant, and to the job when one asked,
as `judge.tenant`, `judge.operator` or `judge.served` (services/tenancy/usage.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session

from tuneforge.domain.errors import ApiError, invalid
from tuneforge.eval import judges as http_judges
from tuneforge.graders.score import JudgeError, JudgeReply
from tuneforge.security.egress import EgressPolicy
from tuneforge.serve import vllm
from tuneforge.serve.params import ModelTarget, Prompt, SamplingParams
from tuneforge.serve.sinks import Sink
from tuneforge.serve.targets import resolve_target
from tuneforge.services.context import Platform
from tuneforge.services.serving.base_models import list_base_models
from tuneforge.services.tenancy import secrets as secret_service
from tuneforge.services.tenancy import usage
from tuneforge.settings import Settings

log = logging.getLogger(__name__)

SERVED, OPERATOR, TENANT = "judge.served", "judge.operator", "judge.tenant"
MAX_CONVERSATIONS = 512  # one batch a trainer sends
_NAMES_SHOWN = 20


class TenantJudges:
    """The judges one tenant's graders may ask (see the module's docstring); `job_id`: the job
    whose grader asks (its tokens are metered to it)."""

    def __init__(self, platform: Platform, tenant_id: str, tier: str, *, tenant_name: str = "",
                 job_id: str | None = None) -> None:
        self.platform = platform
        self.tenant_id = tenant_id
        self.tier = tier
        self.tenant_name = tenant_name
        self.job_id = job_id

    def check(self, grader: Any, where: str) -> None:
        with self.platform.db.session() as session:
            check_judge(session, self.platform.settings, self.tenant_id, self.tenant_name, grader, where)

    def _served_target(self, model: str) -> ModelTarget | None:
        with self.platform.db.session() as session:
            return served_target(session, self.tenant_id, self.tenant_name, model)

    # -- asking ------------------------------------------------------------------------------

    def complete_many(self, grader: Any, conversations: list[list[dict[str, str]]], *,
                      sampling: Mapping[str, Any], schema: Mapping[str, Any]) -> list[JudgeReply | JudgeError]:
        settings = self.platform.settings
        kind = TENANT if grader.endpoint is not None else OPERATOR if grader.model in settings.eval_endpoints \
            else SERVED
        try:
            if kind == SERVED:
                replies = self._served(grader, conversations, sampling, schema)
            else:
                replies = self._over_http(grader, conversations, sampling)
        except JudgeError as exc:
            replies = [exc for _ in conversations]
        self._meter(kind, grader.model, replies)
        return replies

    def _over_http(self, grader: Any, conversations: list[list[dict[str, str]]],
                   sampling: Mapping[str, Any]) -> list[JudgeReply | JudgeError]:
        settings = self.platform.settings
        secrets: dict[str, str] = {}
        if grader.api_key_secret is not None:
            with self.platform.db.session() as session:
                secrets = secret_service.values(session, self.platform.sealer, self.tenant_id,
                                                {grader.api_key_secret})
        target = http_judges.endpoint_target(grader, settings.eval_endpoints, secrets)
        assert target is not None
        if target.trusted:
            return http_judges.ask_many(target, conversations, sampling)
        with EgressPolicy.from_settings(settings).client(timeout=target.timeout_s) as client:
            return http_judges.ask_many(target, conversations, sampling, client=client)

    def _served(self, grader: Any, conversations: list[list[dict[str, str]]], sampling: Mapping[str, Any],
                schema: Mapping[str, Any]) -> list[JudgeReply | JudgeError]:
        target = self._served_target(grader.model)
        if target is None:
            raise JudgeError(f"the judge {grader.model!r} is no longer served")
        settings = self.platform.settings
        max_tokens = min(int(sampling.get("max_completions_tokens") or settings.inference_default_max_tokens),
                         settings.inference_max_tokens_per_request)
        with self.platform.db.session() as session:
            try:
                _adapter, upstream = vllm.handed_off(session, self.tenant_id, self.platform, target)
            except ApiError as exc:
                raise JudgeError(exc.message) from None
        if upstream is not None:
            return self._on_vllm(upstream, conversations, sampling, schema, max_tokens)
        params = SamplingParams(max_new_tokens=max_tokens, temperature=float(sampling.get("temperature", 0.0)),
                                top_p=float(sampling.get("top_p", 1.0)), seed=sampling.get("seed"), json_mode=True)
        return self._on_engine(target, conversations, params)

    def _on_engine(self, target: ModelTarget, conversations: list[list[dict[str, str]]],
                   params: SamplingParams) -> list[JudgeReply | JudgeError]:
        """The built-in engine's answers (one JSON object each, `json_mode`), side by side as far as
        the tenant's tokens in flight allow: when they are spent, the batch waits for its own
        oldest answer before it queues more."""
        engine = (self.platform.inference or self.platform.inference_engine()).for_tenant(
            self.tenant_id, self.platform.settings.inference_tokens_in_flight_for(self.tier))
        replies: list[JudgeReply | JudgeError] = [JudgeError("not asked")] * len(conversations)
        waiting = deque(range(len(conversations)))
        running: deque[tuple[int, Sink]] = deque()
        while waiting or running:
            while waiting:
                index = waiting[0]
                try:
                    seeded = params if params.seed is None else replace(params, seed=params.seed + index)
                    running.append((index, engine.submit(target, Prompt(messages=tuple(conversations[index])),
                                                         seeded)))
                except ApiError as exc:
                    if exc.status_code == 429 and running:
                        break  # room comes back as this batch's own answers end
                    replies[index] = JudgeError(f"the judge could not be asked: {exc.message}")
                waiting.popleft()
            if running:
                index, sink = running.popleft()
                try:
                    completion = sink.completion()
                except ApiError as exc:
                    replies[index] = JudgeError(f"the judge failed: {exc.message}")
                    continue
                except Exception:  # noqa: BLE001 - the engine's own failure: logged, the sample's error
                    log.exception("the judge %s failed on the built-in engine", target.name)
                    replies[index] = JudgeError("the judge failed on this platform's engine")
                    continue
                replies[index] = JudgeReply(completion.text, completion.usage.total_tokens,
                                            completion_tokens=completion.usage.completion_tokens)
        return replies

    def _on_vllm(self, upstream: vllm.Upstream, conversations: list[list[dict[str, str]]],
                 sampling: Mapping[str, Any], schema: Mapping[str, Any],
                 max_tokens: int) -> list[JudgeReply | JudgeError]:
        handoff = vllm.handoff_for(self.platform)
        assert handoff is not None
        body: dict[str, Any] = {
            "model": upstream.name, "max_tokens": max_tokens, "temperature": sampling.get("temperature", 0.0),
            "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": dict(schema)}}}
        body.update({key: sampling[key] for key in ("top_p", "seed") if sampling.get(key) is not None})

        def one(messages: list[dict[str, str]]) -> JudgeReply | JudgeError:
            try:
                answer = handoff.call_blocking(upstream, "/v1/chat/completions", {**body, "messages": messages})
                text = answer["choices"][0]["message"].get("content") or ""
                tokens = answer.get("usage") or {}
                return JudgeReply(str(text), int(tokens.get("total_tokens") or 0),
                                  completion_tokens=int(tokens.get("completion_tokens") or 0))
            except ApiError as exc:
                return JudgeError(f"the judge failed: {exc.message}")
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                return JudgeError("the judge's server answered without choices[0].message")

        with ThreadPoolExecutor(max(1, min(http_judges.JUDGE_CONCURRENCY, len(conversations))), "judge") as pool:
            return list(pool.map(one, conversations))

    def _meter(self, kind: str, model: str, replies: list[JudgeReply | JudgeError]) -> None:
        answered = [reply for reply in replies if isinstance(reply, JudgeReply)]
        if not answered:
            return
        completion = sum(reply.completion_tokens for reply in answered)
        prompt = sum(reply.tokens for reply in answered) - completion
        try:
            with self.platform.db.session() as session:
                usage.meter_tokens(session, self.tenant_id, self.job_id, kind, model, requests=len(answered),
                                   prompt_tokens=max(0, prompt), completion_tokens=completion, now=time.time())
                session.commit()
        except Exception:  # noqa: BLE001 - the answers stand; the operator's log has the lost record
            log.exception("metering %s judge tokens of tenant %s (job %s) failed", kind, self.tenant_id,
                          self.job_id)


class JudgeCheck:
    """The judges' check alone, in the caller's session (a job's creation: its trainer asks later)."""

    def __init__(self, session: Session, settings: Settings, tenant_id: str, tenant_name: str = "") -> None:
        self.session, self.settings, self.tenant_id, self.tenant_name = session, settings, tenant_id, tenant_name

    def check(self, grader: Any, where: str) -> None:
        check_judge(self.session, self.settings, self.tenant_id, self.tenant_name, grader, where)

    def complete_many(self, grader: Any, conversations: list[list[dict[str, str]]], *,
                      sampling: Mapping[str, Any], schema: Mapping[str, Any]) -> list[JudgeReply | JudgeError]:
        """At creation nothing is judged: every conversation's answer is this error (a job's judges
        are asked by its trainer through the control plane, `TenantJudges`)."""
        return [JudgeError("judges are asked when the job trains, not when it is created") for _ in conversations]


def check_judge(session: Session, settings: Settings, tenant_id: str, tenant_name: str, grader: Any,
                where: str) -> None:
    """400 naming the grader's field when its judge cannot be asked for this tenant."""
    if grader.endpoint is not None:
        EgressPolicy.from_settings(settings).check_url(grader.endpoint, param=f"{where}.endpoint")
        if grader.api_key_secret is not None:
            secret_service.require(session, tenant_id, grader.api_key_secret, f"{where}.api_key_secret")
        return
    if grader.model in settings.eval_endpoints or served_target(session, tenant_id, tenant_name,
                                                                  grader.model) is not None:
        return
    bases = [row.name for row in list_base_models(session)]
    operator = sorted(settings.eval_endpoints)
    offered = [f"an endpoint the operator offers ({_listed(operator)})"] if operator else []
    offered.append(f"a base model ({_listed(bases)})" if bases else "a base model (none is registered)")
    raise invalid(f"{where}.model: {grader.model!r} is not a judge this platform offers; a judge is "
                  f"{', '.join(offered)}, one of your ft: models, or your own API given as `endpoint`",
                  param=f"{where}.model", code="model_not_found")


def served_target(session: Session, tenant_id: str, tenant_name: str, model: str) -> ModelTarget | None:
    """What `model` names among the models this platform serves the tenant; None when nothing."""
    if model.startswith("route:"):
        return None  # a route picks a version per request: a judge is one model
    try:
        return resolve_target(session, tenant_id, model, tenant_name)
    except ApiError:
        return None


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMES_SHOWN])
    return shown + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")

