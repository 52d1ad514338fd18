"""Hand-off to vLLM: the adapters that serve production traffic are loaded into vLLM servers,
and requests for them are sent there instead of the built-in engine.

The operator lists vLLM servers per base model (`TUNEFORGE_VLLM_URLS`). An adapter of such a base
is *deployed* when its model is in the `production` stage or has weight in an A/B route, and is
not deleted. A deployed adapter is copied from the object store into a directory the servers
share (`TUNEFORGE_VLLM_ADAPTER_DIR`, seen by them as `TUNEFORGE_VLLM_ADAPTER_DIR_ON_SERVER`) and
loaded through vLLM's runtime LoRA API under its model id:

    POST /v1/load_lora_adapter    {"lora_name": "<model id>", "lora_path": "<dir on the server>"}
    POST /v1/unload_lora_adapter  {"lora_name": "<model id>"}

`sync` makes every server hold exactly the deployed adapters of its base (of the adapters named
like fine-tuned models, `ft:…`; others an operator loaded are left alone): it runs after a
promotion, deletion or route change, and every `TUNEFORGE_VLLM_SYNC_INTERVAL_S` in the scheduler
(a restarted server has lost them all). A request for a deployed adapter, or for the base itself,
is proxied to a server holding it (`call`, `stream`); an adapter a server refused to load (DoRA,
a rank above its --max-lora-rank, ...) is served by the built-in engine instead.

The servers are the operator's, trusted like eval endpoints: the egress policy does not apply.
What a tenant sees of their answers is ours: their errors are mapped to stable messages and
codes, and the detail goes to the log under a request id.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from tuneforge.db.repos import models as model_repo
from tuneforge.db.repos import routes as route_repo
from tuneforge.db.tables import FineTunedModel
from tuneforge.domain.errors import ApiError, invalid, rate_limited
from tuneforge.domain.ids import correlation_id
from tuneforge.security.tls import verified_context
from tuneforge.settings import Settings
from tuneforge.storage.store import ObjectStore

log = logging.getLogger(__name__)

MANAGED_PREFIX = "ft:"  # adapters named like fine-tuned models are tuneforge's to load and unload
LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
DOWN_FOR_S = 5.0  # a server that did not answer is passed over this long
_COMPLETE = ".complete"


@dataclass(frozen=True)
class Deployed:
    """An adapter that should be on the vLLM servers of its base."""

    name: str  # the fine-tuned model id: vLLM's lora_name
    base: str
    artifact_prefix: str


@dataclass(frozen=True)
class Upstream:
    """Where one request goes: a server, and the model name it knows the weights by."""

    server: str
    name: str


class AdapterMissing(Exception):
    """The server does not hold the adapter (it restarted since it was loaded)."""


def deployed(session: Session, bases: Iterable[str]) -> list[Deployed]:
    """The adapters of `bases` that should be on vLLM: in production or with weight in a route."""
    bases = list(bases)
    if not bases:
        return []
    rows = model_repo.live_adapters_of(session, bases)
    routed = {(route.tenant_id, version["model"]) for route in route_repo.all_routes(session)
              for version in route.versions if version["weight"] > 0}
    return [Deployed(row.model_id, row.base_model, row.artifact_prefix) for row in rows
            if row.stage == "production" or (row.tenant_id, row.model_id) in routed]


def is_deployed(session: Session, row: FineTunedModel) -> bool:
    if row.artifact_kind != "adapter" or row.deprecated_at is not None or row.artifacts_deleted_at is not None:
        return False
    return row.stage == "production" or bool(route_repo.using(session, row.tenant_id, row.model_id))


class VllmHandoff:
    def __init__(self, settings: Settings, store: ObjectStore) -> None:
        self.servers = dict(settings.vllm_urls)
        self.store = store
        self.local_dir = Path(settings.vllm_adapter_dir or settings.home / "vllm-adapters")
        self.remote_dir = (settings.vllm_adapter_dir_on_server or str(self.local_dir)).rstrip("/")
        self.timeout_s = settings.vllm_timeout_s
        self.headers = {"Authorization": f"Bearer {settings.vllm_api_key}"} if settings.vllm_api_key else {}
        self._held: dict[str, set[str]] = {}  # server -> the adapters this process knows it holds
        self._refused: dict[str, str] = {}  # adapter -> why a server would not load it
        self._down_until: dict[str, float] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()  # _held, _refused, _down_until
        self._files_lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._async: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None

    def serves(self, base: str) -> bool:
        return base in self.servers

    # -- control: which adapters each server holds --------------------------------------------------

    def sync(self, session: Session, bases: Iterable[str] | None = None) -> dict[str, list[str]]:
        """Load what should be on each server of `bases` (default all) and unload what should not.
        A server that does not answer is skipped (the next sync retries)."""
        chosen = [base for base in (self.servers if bases is None else bases) if base in self.servers]
        want: dict[str, dict[str, Deployed]] = {base: {} for base in chosen}
        for item in deployed(session, chosen):
            want[item.base][item.name] = item
        report: dict[str, list[str]] = {"loaded": [], "unloaded": [], "failed": []}
        for base in chosen:
            for server in self.servers[base]:
                try:
                    held = self.list_adapters(server)
                except ApiError:
                    report["failed"].append(server)
                    continue
                for name in sorted(set(want[base]) - held):
                    if self._load(server, want[base][name]):
                        report["loaded"].append(f"{name}@{server}")
                for name in sorted(held - set(want[base])):
                    if name.startswith(MANAGED_PREFIX) and self._unload(server, name):
                        report["unloaded"].append(f"{name}@{server}")
        self._drop_files(keep={name for wanted in want.values() for name in wanted}, bases=chosen)
        return report

    def list_adapters(self, server: str) -> set[str]:
        """The LoRA adapters a server holds (the entries of its model list that have a parent)."""
        response = self._control("GET", server, MODELS_PATH)
        if response.status_code != 200:
            raise self._failure(server, MODELS_PATH, response.status_code, response.text)
        try:
            entries = response.json().get("data", [])
            held = {str(entry["id"]) for entry in entries if entry.get("parent")}
        except (ValueError, AttributeError, KeyError, TypeError):
            raise self._failure(server, MODELS_PATH, 502, response.text[:500]) from None
        with self._lock:
            self._held[server] = set(held)
        return held

    def _load(self, server: str, item: Deployed) -> bool:
        path = self.materialize(item)
        try:
            response = self._control("POST", server, LOAD_PATH, {"lora_name": item.name, "lora_path": path})
        except ApiError:
            return False
        text = response.text
        if response.status_code == 200 or (response.status_code == 400 and "already" in text.lower()):
            with self._lock:
                self._held.setdefault(server, set()).add(item.name)
                self._refused.pop(item.name, None)
            return True
        if 400 <= response.status_code < 500:  # the adapter itself is the problem: the built-in engine serves it
            log.warning("vLLM %s would not load %s (HTTP %s): %s", server, item.name, response.status_code,
                        text[:500])
            with self._lock:
                self._refused[item.name] = text[:500]
        else:
            self._failure(server, LOAD_PATH, response.status_code, text)
        return False

    def _unload(self, server: str, name: str) -> bool:
        try:
            response = self._control("POST", server, UNLOAD_PATH, {"lora_name": name})
        except ApiError:
            return False
        if response.status_code in (200, 400, 404):  # unloaded, or not there to unload
            with self._lock:
                self._held.get(server, set()).discard(name)
            return True
        self._failure(server, UNLOAD_PATH, response.status_code, response.text)
        return False

    def materialize(self, item: Deployed) -> str:
        """The adapter's files in the shared directory (copied once: artifacts never change); returns
        the directory as the servers see it. Its name is a digest: no tenant text becomes a path."""
        name = _dir_name(item.name)
        target = self.local_dir / name
        with self._files_lock:
            if not (target / _COMPLETE).exists():
                staging = self.local_dir / f".{name}.partial"
                shutil.rmtree(staging, ignore_errors=True)
                if not self.store.download_prefix(item.artifact_prefix, staging):
                    raise ApiError(503, "the files of this model are missing", type="server_error",
                                   param="model", code="model_unavailable")
                (staging / _COMPLETE).write_text(item.name)
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
        return f"{self.remote_dir}/{name}"

    def _drop_files(self, keep: set[str], bases: list[str]) -> None:
        """Remove shared copies of adapters of `bases` that no server should hold any more."""
        if not self.local_dir.is_dir():
            return
        kept = {_dir_name(name) for name in keep}
        with self._files_lock:
            for path in self.local_dir.iterdir():
                marker = path / _COMPLETE
                if path.name in kept or not marker.exists():
                    continue
                with self._lock:
                    held = any(marker.read_text() in names for server, names in self._held.items()
                               if any(server in self.servers[base] for base in bases))
                if not held:
                    shutil.rmtree(path, ignore_errors=True)

    def _control(self, method: str, server: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s, headers=self.headers, follow_redirects=False,
                                        trust_env=False, verify=verified_context())
        try:
            return self._client.request(method, server + path, json=body)
        except httpx.HTTPError as exc:
            self._mark_down(server)
            raise self._failure(server, path, None, repr(exc)) from None

    # -- data plane: where a request goes ---------------------------------------------------------

    def upstream(self, base: str, adapter: Deployed | None) -> Upstream | None:
        """The server (and name) for a request on `base` alone or with a deployed `adapter`; None:
        the built-in engine serves it (no server for the base, or none will hold the adapter). May
        load the adapter (blocking): call it from a worker thread."""
        servers = [s for s in self.servers.get(base, ()) if self._down_until.get(s, 0.0) <= time.monotonic()]
        if not servers:
            return None
        if adapter is None:
            return Upstream(self._next(servers), base)
        if adapter.name in self._refused:
            return None
        holding = [s for s in servers if adapter.name in self._held.get(s, ())]
        if not holding:
            holding = [s for s in servers if self._load(s, adapter)]
        return Upstream(self._next(holding), adapter.name) if holding else None

    def forget(self, upstream: Upstream) -> None:
        """The server answered that it does not hold the adapter: the next request loads it again."""
        with self._lock:
            self._held.get(upstream.server, set()).discard(upstream.name)

    def _next(self, servers: list[str]) -> str:
        return servers[next(self._turn) % len(servers)]

    def _mark_down(self, server: str) -> None:
        with self._lock:
            self._down_until[server] = time.monotonic() + DOWN_FOR_S

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            self._async = (loop, httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers,
                                                   follow_redirects=False, trust_env=False,
                                                   verify=verified_context()))
        return self._async[1]

    async def call(self, upstream: Upstream, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The server's JSON answer to `body`; its refusals as the tenant's stable errors."""
        try:
            response = await self._async_client().post(upstream.server + path, json=body)
        except httpx.HTTPError as exc:
            self._mark_down(upstream.server)
            raise self._failure(upstream.server, path, None, repr(exc)) from None
        return self._answer(upstream, path, response)

    def call_blocking(self, upstream: Upstream, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """`call` from a worker thread (the judges of graders: services/serving/judges.py)."""
        return self._answer(upstream, path, self._control("POST", upstream.server, path, body))

    def _answer(self, upstream: Upstream, path: str, response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 200:
            raise self._answer_error(upstream, path, response.status_code, response.text, response.headers)
        try:
            answer = response.json()
        except ValueError:
            raise self._failure(upstream.server, path, 502, response.text[:500]) from None
        if not isinstance(answer, dict):
            raise self._failure(upstream.server, path, 502, response.text[:500])
        return answer

    async def stream(self, upstream: Upstream, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Opens the server's stream: errors before it starts are raised here; then an iterator of
        its events (each a parsed `data:` object); a failure mid-stream is raised from it."""
        client = self._async_client()
        request = client.build_request("POST", upstream.server + path, json=body)
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            self._mark_down(upstream.server)
            raise self._failure(upstream.server, path, None, repr(exc)) from None
        if response.status_code != 200:
            text = (await response.aread()).decode("utf-8", "replace")
            await response.aclose()
            raise self._answer_error(upstream, path, response.status_code, text, response.headers)
        return self._events(upstream, path, response)

    async def _events(self, upstream: Upstream, path: str, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    raise self._failure(upstream.server, path, 502, data[:500]) from None
                if not isinstance(event, dict):
                    raise self._failure(upstream.server, path, 502, data[:500])
                if "error" in event:
                    code = event["error"].get("code") if isinstance(event["error"], dict) else None
                    raise self._answer_error(upstream, path, code if isinstance(code, int) else 500, data, {})
                yield event
            raise self._failure(upstream.server, path, 502, "the stream ended without [DONE]")
        except httpx.HTTPError as exc:
            raise self._failure(upstream.server, path, None, repr(exc)) from None
        finally:
            await response.aclose()

    # -- errors the tenant sees -------------------------------------------------------------------

    def _answer_error(self, upstream: Upstream, path: str, status: int, text: str, headers: Any) -> Exception:
        if status == 404 and upstream.name.startswith(MANAGED_PREFIX):
            self.forget(upstream)
            return AdapterMissing(upstream.name)
        if status in (400, 422):
            request_id = correlation_id("req")
            log.warning("vLLM %s%s refused a request [%s] (HTTP %s): %s", upstream.server, path, request_id,
                        status, text[:1000])
            if "context length" in text.lower() or "maximum context" in text.lower():
                return invalid("The prompt and the tokens asked for are more than the model's context length "
                               f"(request id {request_id}).", code="context_length_exceeded")
            return invalid(f"The serving engine refused this request (request id {request_id}).",
                           code="request_refused")
        if status in (429, 503):
            log.info("vLLM %s is at capacity (HTTP %s)", upstream.server, status)
            return rate_limited("The model is at capacity; retry shortly.", code="engine_overloaded",
                                retry_after=_retry_after(headers))
        return self._failure(upstream.server, path, status, text)

    def _failure(self, server: str, path: str, status: int | None, detail: str) -> ApiError:
        request_id = correlation_id("req")
        log.warning("vLLM %s%s failed [%s] (HTTP %s): %s", server, path, request_id, status, detail[:1000])
        return ApiError(503, f"The serving engine is unavailable; retry shortly (request id {request_id}).",
                        type="server_error", code="engine_unavailable", retry_after=DOWN_FOR_S)


def _dir_name(model_id: str) -> str:
    return "lora-" + hashlib.sha256(model_id.encode()).hexdigest()[:32]


def _retry_after(headers: Any) -> float:
    try:
        return max(1.0, float(headers.get("retry-after", 1)))
    except (TypeError, ValueError, AttributeError):
        return 1.0


_create_lock = threading.Lock()


def handoff_for(platform: Any) -> VllmHandoff | None:
    """The platform's hand-off (made once), or None when no vLLM server is configured."""
    if not platform.settings.vllm_urls:
        return None
    if platform.vllm is None:
        with _create_lock:
            if platform.vllm is None:
                platform.vllm = VllmHandoff(platform.settings, platform.store)
    return platform.vllm


def handed_off(session: Session, tenant_id: str, platform: Any,
               target: Any) -> tuple[Deployed | None, Upstream | None]:
    """The vLLM server for `target` (a ModelTarget) when its base has servers and it is the base
    itself or a deployed adapter; may load the adapter there first (blocking). (None, None): the
    built-in engine answers it."""
    handoff = handoff_for(platform)
    if handoff is None or not handoff.serves(target.base.name):
        return None, None
    if target.is_base:
        return None, handoff.upstream(target.base.name, None)
    row = model_repo.get(session, tenant_id, target.name)
    if row is None or not is_deployed(session, row):  # a checkpoint, a model in dev, a full fine-tune
        return None, None
    adapter = Deployed(row.model_id, row.base_model, row.artifact_prefix)
    return adapter, handoff.upstream(row.base_model, adapter)


def serving_changed(platform: Any, session: Session) -> None:
    """After a promotion, deletion or route change, once the caller has committed it: bring the vLLM
    servers in line at once (the scheduler's periodic sync retries whatever fails here)."""
    handoff = handoff_for(platform)
    if handoff is None:
        return
    try:
        report = handoff.sync(session)
    except Exception:  # noqa: BLE001 - the change is stored; serving catches up at the next sync
        log.exception("syncing the vLLM servers after a change failed")
        return
    if report["loaded"] or report["unloaded"]:
        log.info("vLLM: loaded %s; unloaded %s", report["loaded"], report["unloaded"])
