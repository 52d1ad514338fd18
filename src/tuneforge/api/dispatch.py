"""Where an inference request goes: the model it names (for `route:NAME`, the version the route
picks, its outcome recorded once the answer has ended), and whether the built-in engine or a
vLLM server answers it (serve/vllm.py); a vLLM answer is relayed in the tenant's names."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from sqlalchemy.orm import Session

from tuneforge.api import sse
from tuneforge.api.headers import ANSWER_HEADERS
from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import ApiError
from tuneforge.domain.ids import new_id
from tuneforge.domain.tenant_text import safe_data
from tuneforge.serve import vllm
from tuneforge.serve.params import ModelTarget, Usage
from tuneforge.serve.targets import resolve_target
from tuneforge.services.context import Platform
from tuneforge.services.serving import routes as route_service

_log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Routed:
    """A request a route sent to one of its versions: recorded once it has ended."""

    choice: route_service.Choice
    response_id: str
    started: float  # time.monotonic()
    first_token: float | None = None

    def _record(self, platform: Platform, outcome: str, usage: list[Usage], ended: float) -> None:
        first_ms = None if self.first_token is None else (self.first_token - self.started) * 1000
        try:
            with platform.db.session() as session:
                route_service.record(session, self.choice, self.response_id, outcome=outcome,
                                     latency_ms=(ended - self.started) * 1000, first_token_ms=first_ms,
                                     prompt_tokens=usage[0].prompt_tokens if usage else 0,
                                     completion_tokens=sum(u.completion_tokens for u in usage))
        except Exception:  # noqa: BLE001 - the answer went out; a lost record must not fail it
            _log.exception("recording routed request %s failed", self.response_id)

    async def finish(self, platform: Platform, outcome: str, usage: list[Usage]) -> None:
        await run_in_threadpool(self._record, platform, outcome, usage, time.monotonic())

    def finish_soon(self, platform: Platform, outcome: str, usage: list[Usage]) -> None:
        """`finish` from a stream's end, which may be a cancellation: the write is handed to a
        worker thread and not awaited."""
        asyncio.get_running_loop().run_in_executor(None, self._record, platform, outcome, list(usage),
                                                   time.monotonic())


@dataclass(frozen=True)
class Resolved:
    target: ModelTarget
    choice: route_service.Choice | None = None  # for `route:NAME`: the version picked
    adapter: vllm.Deployed | None = None  # a deployed adapter that vLLM may serve
    upstream: vllm.Upstream | None = None  # the vLLM server the request goes to; None: the built-in engine


async def resolve(request: Request, session: Session, tenant: Tenant, platform: Platform, body: BaseModel,
                   kind: str, started: float) -> tuple[Resolved, Routed | None, str]:
    """What `model` names, where it is served, and the answer's id (`kind-…`); for `route:NAME`,
    the version the route picked (the answer's headers say which)."""
    resolved = await run_in_threadpool(_target, session, tenant, platform, body.model, body.user)
    reply_id = new_id(kind)
    choice = resolved.choice
    if choice is None:
        return resolved, None, reply_id
    request.scope.setdefault(ANSWER_HEADERS, {}).update({
        "X-Tuneforge-Route": quote(choice.route.name, safe=_HEADER_SAFE),
        "X-Tuneforge-Model": quote(choice.model, safe=_HEADER_SAFE)})
    return resolved, Routed(choice, reply_id, started), reply_id


_HEADER_SAFE = "!#$&'()*+,/:;=?@[]~"


def _target(session: Session, tenant: Tenant, platform: Platform, model: str, user: str | None = None) -> Resolved:
    name = route_service.route_name(model)
    choice = route_service.choose(session, tenant.tenant_id, name, user) if name is not None else None
    target = resolve_target(session, tenant.tenant_id, choice.model if choice else model, tenant.name)
    adapter, upstream = vllm.handed_off(session, tenant.tenant_id, platform, target)
    # Hand the database connection back before a generation that can take seconds:
    # requests waiting for the model must not hold the pool.
    session.commit()
    return Resolved(target, choice, adapter, upstream)


_NOT_FORWARDED = {"metadata", "store", "service_tier"}


async def proxied(path: str, body: BaseModel, resolved: Resolved, reply_id: str, routed: Routed | None,
                   platform: Platform) -> Any:
    """The answer of the vLLM server `resolved` names, in the tenant's names (its id, its model);
    None when the server no longer holds the adapter and none will load it (the built-in engine
    answers then)."""
    handoff = vllm.handoff_for(platform)
    assert handoff is not None and resolved.upstream is not None
    upstream = resolved.upstream
    wants_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    payload = body.model_dump(exclude_none=True, exclude=_NOT_FORWARDED)
    if body.stream:  # usage is always asked for: a routed request records it
        payload["stream_options"] = {"include_usage": True}
    for retried in (False, True):
        try:
            if body.stream:
                events = await observed(routed, platform, handoff.stream(upstream, path, payload | {
                    "model": upstream.name}))
                return sse.chunks_response(_relayed(events, reply_id, resolved.target.name, wants_usage, routed,
                                                    platform), keepalive_s=platform.settings.stream_keepalive_s)
            answer = await observed(routed, platform, handoff.call(upstream, path, payload | {
                "model": upstream.name}))
            break
        except vllm.AdapterMissing:  # the server restarted since it loaded the adapter: load it again
            again = await run_in_threadpool(handoff.upstream, resolved.target.base.name, resolved.adapter)
            if again is None or retried:
                return None
            upstream = again
    answer = safe_data(answer)  # a model's text is escaped wherever it comes from (domain/tenant_text.py)
    answer["id"], answer["model"] = reply_id, resolved.target.name
    if routed is not None:
        await routed.finish(platform, "ok", _usage_of(answer))
    return answer


def _usage_of(event: dict[str, Any]) -> list[Usage]:
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return []
    return [Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))]


async def _relayed(events: AsyncIterator[dict[str, Any]], reply_id: str, model: str, wants_usage: bool,
                   routed: Routed | None, platform: Platform) -> AsyncIterator[dict[str, Any]]:
    """A vLLM stream's chunks in the tenant's names; its usage chunk only when the tenant asked."""
    usage: list[Usage] = []
    outcome = "cancelled"
    try:
        async for event in events:
            if event.get("usage") and not event.get("choices"):
                usage = _usage_of(event)
                if not wants_usage:
                    continue
            elif not wants_usage:
                event.pop("usage", None)
            if routed is not None and routed.first_token is None and event.get("choices"):
                routed.first_token = time.monotonic()
            yield safe_data(event) | {"id": reply_id, "model": model}
        outcome = "ok"
    except ApiError as exc:
        outcome = "error"
        yield exc.envelope()
    except vllm.AdapterMissing:
        outcome = "error"
        yield ApiError(503, "The model stopped being served mid-answer; retry shortly.", type="server_error",
                       code="engine_unavailable", retry_after=vllm.DOWN_FOR_S).envelope()
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        if routed is not None:
            routed.finish_soon(platform, outcome, usage)


async def observed(routed: Routed | None, platform: Platform, work: Awaitable[T]) -> T:
    """`work`'s result; a routed request that fails there is recorded as an error."""
    try:
        return await work
    except vllm.AdapterMissing:  # retried by the caller: not an outcome yet
        raise
    except Exception:
        if routed is not None:
            await routed.finish(platform, "error", [])
        raise
