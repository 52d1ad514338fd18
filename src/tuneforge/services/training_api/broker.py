"""The training API's state in the control plane: sessions, models, sampling sessions, futures, and
the queue each co-training worker takes its cycles from.

Every request a tenant submits (create_model, forward_backward, optim_step, save/load, sample)
becomes an `Op` with a future. The ops of one model run strictly in its `seq_id` order (the SDK
numbers them; early arrivals wait in a buffer, a gap older than `GAP_S` is skipped, a resent
`seq_id` gets the same future). A model's next op is *ready* once the one before it finished.

A worker (one per base model: `pools.py`) asks for work; it gets one cycle: at most one ready op
per model, the forward_backward ops chosen round-robin over tenants up to the cycle's token budget
(`training_api_cycle_tokens`), so that a tenant's large batch cannot starve another's. It sends
the cycle's results with its next request for work. One op's failure is that op's future's error.

All of this state lives in the API process's event loop (every method here runs on it); what must
outlast the process (run records, checkpoints) is in the object store (`runs.py`).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tuneforge.domain.errors import ApiError, invalid, not_found, rate_limited, unauthorized

log = logging.getLogger(__name__)
T = TypeVar("T")

GAP_S = 5.0  # a missing seq_id this old is skipped: the ops after it run
RESULT_TTL_S = 3600.0  # a finished future stays retrievable this long
WORK_WAIT_S = 20.0  # a worker's request for work is held this long when there is none
RETRY_AFTER_S = 2.0
SESSIONS_PER_TENANT = 64  # sessions open at once (heard from within SESSION_GONE_S)
SESSION_GONE_S = 120.0  # a session without a request or heartbeat this long is no longer counted
SAMPLERS_PER_TENANT = 16  # samplers of the tenant's own weights held in workers; a newer one retires the oldest
PROTO = "application/x-protobuf"
FB_KINDS = ("forward_backward",)


@dataclass
class Future:
    request_id: str
    tenant: str
    kind: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    content_type: str = "application/json"
    body: bytes | dict | None = None
    error: str | None = None
    category: str = "user"
    finished_at: float | None = None

    def resolve(self, body: bytes | dict, content_type: str = "application/json") -> None:
        self.body, self.content_type, self.finished_at = body, content_type, time.monotonic()
        self.done.set()

    def fail(self, message: str, category: str = "user") -> None:
        self.error, self.category, self.finished_at = message, category, time.monotonic()
        self.done.set()


@dataclass
class Op:
    op_id: str
    tenant: str
    kind: str
    model: str | None  # the training model (ordering) or sampler it acts on
    payload: dict[str, Any]
    future: Future
    tokens: int = 0
    # run on the control plane when the worker's result comes back (e.g. write a checkpoint)
    after: Callable[[Op, dict[str, Any]], Awaitable[None]] | None = None
    session_id: str | None = None  # the session a sampling request came through (a lapsed one's is dropped)

    def wire(self) -> dict[str, Any]:
        return {"op_id": self.op_id, "kind": self.kind, "model": self.model, **self.payload}

    def request_id_counted(self) -> bool:
        """A tenant's request (counted against its queue limit), not the platform's own op."""
        return bool(self.future.request_id)


@dataclass
class Session:
    session_id: str
    tenant: str
    created: float
    tags: list[str]
    user_metadata: dict[str, str]
    finished: bool = False
    last_seen: float = 0.0
    models: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=list)


@dataclass
class Model:
    model_id: str
    tenant: str
    session_id: str
    base: str
    shape: dict[str, Any]
    created: float
    user_metadata: dict[str, str] = field(default_factory=dict)
    next_seq: int = 1
    buffered: dict[int, Op] = field(default_factory=dict)
    buffered_since: float | None = None
    ready: deque[Op] = field(default_factory=deque)
    running: Op | None = None
    seen: dict[int, Future] = field(default_factory=dict)
    last_request: float = 0.0
    last_checkpoint: dict[str, Any] | None = None
    last_sampler_checkpoint: dict[str, Any] | None = None
    hosted: bool = False  # the worker holds it now
    state_key: str | None = None  # where its state was kept when its worker let it go (idle, preempted)
    last_served: float = 0.0  # when a cycle last took one of its ops (fair turns)
    base_sha256: str = ""  # the base's weights it trains on (checkpoints record it: a registered model needs it)


@dataclass
class Sampler:
    sampler_id: str
    tenant: str
    session_id: str
    base: str
    model_path: str | None
    hosted_as: str | None  # the adapter name the worker holds it under (None: the base alone)
    seen: dict[int, tuple[Future, list[str]]] = field(default_factory=dict)
    state_key: str | None = None  # a checkpoint's state (model_path) or where the worker's copy was kept
    created: float = field(default_factory=time.monotonic)
    retired: bool = False  # its weights were let go for a newer sampler of the tenant's


@dataclass
class Pool:
    pool_id: str
    base: str
    token: str
    ops: deque[Op] = field(default_factory=deque)  # ready ops of samplers and model-less work
    running: dict[str, Op] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_seen: float = 0.0
    last_busy: float = field(default_factory=time.monotonic)
    stop: bool = False  # the worker is told to stop at its next request (idle)
    retiring: bool = False  # let go as idle (its worker is, or is about to be, told to stop)
    attempt: int = 0  # a scheduled pool: the attempt of its job whose worker serves it (0: none now)
    generation: int = 0  # bumped when its worker changes: a request for work of an earlier one takes nothing


class Broker:
    def __init__(self, *, cycle_tokens: int, models_per_tenant: int | dict[str, int],
                 queued_per_tenant: int | dict[str, int], launch: Callable[[Pool], None],
                 retire: Callable[[Pool], None] | None = None) -> None:
        self.cycle_tokens = cycle_tokens
        self.models_per_tenant = models_per_tenant
        self.queued_per_tenant = queued_per_tenant
        self._launch = launch
        # an idle pool is let go: by default its worker is told to stop at once; a scheduled pool's
        # job is cancelled first (`scheduled.py`), which then tells it
        self._retire = retire or stop_now
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, Sampler] = {}
        self.futures: dict[str, Future] = {}
        self.pools: dict[str, Pool] = {}  # by base model name
        self._ids = itertools.count(1)
        self._queued: dict[str, int] = {}  # per tenant: ops submitted and not finished
        self._served: dict[str, float] = {}  # per tenant: when a cycle last took one of its ops
        self.tiers: dict[str, str] = {}  # per tenant: its tier, as its last request showed it
        self.closed = False  # the process is stopping: workers are told to stop

    def _limit(self, limits: int | dict[str, int], tenant: str) -> int:
        if isinstance(limits, int):
            return limits
        tier = self.tiers.get(tenant, "free")
        return limits.get(tier, limits.get("free", min(limits.values(), default=1)))

    def close(self) -> None:
        self.closed = True
        for pool in self.pools.values():
            pool.wake.set()

    # ids and lookups (another tenant's object is not found, never forbidden) ------------------------
    def _request_id(self) -> str:
        return f"req-{uuid.uuid4().hex[:16]}-{next(self._ids)}"

    @staticmethod
    def _own(table: dict[str, T], key: str, tenant: str, what: str, param: str) -> T:
        found = table.get(key)
        if found is None or found.tenant != tenant:  # type: ignore[attr-defined]
            raise not_found(f"{what} {key} not found", param)
        return found

    def session(self, tenant: str, session_id: str) -> Session:
        return self._own(self.sessions, session_id, tenant, "session", "session_id")

    def model(self, tenant: str, model_id: str) -> Model:
        return self._own(self.models, model_id, tenant, "model", "model_id")

    def sampler(self, tenant: str, sampler_id: str) -> Sampler:
        return self._own(self.samplers, sampler_id, tenant, "sampling session", "sampling_session_id")

    def future(self, tenant: str, request_id: str) -> Future:
        return self._own(self.futures, request_id, tenant, "request", "request_id")

    # sessions ------------------------------------------------------------------------------------------
    def create_session(self, tenant: str, tags: list[str], user_metadata: dict[str, str]) -> Session:
        self.expire()
        now = time.monotonic()
        open_now = sum(1 for s in self.sessions.values()
                       if s.tenant == tenant and not s.finished and now - s.last_seen < SESSION_GONE_S)
        if open_now >= SESSIONS_PER_TENANT:
            raise rate_limited(f"this tenant has {open_now} training-API sessions open, its limit; close one "
                               "(ServiceClient.close) or let one end", code="too_many_sessions", retry_after=30.0)
        session = Session(str(uuid.uuid4()), tenant, time.time(), tags, user_metadata, last_seen=time.monotonic())
        self.sessions[session.session_id] = session
        return session

    def heartbeat(self, tenant: str, session_id: str) -> None:
        session = self.session(tenant, session_id)
        if session.finished:
            raise ApiError(410, f"session {session_id} has finished", code="session_finished")
        session.last_seen = time.monotonic()

    def finish(self, tenant: str, session_id: str) -> None:
        self.session(tenant, session_id).finished = True

    # models --------------------------------------------------------------------------------------------
    def new_model(self, tenant: str, session_id: str, model_seq_id: int, base: str, shape: dict[str, Any],
                  user_metadata: dict[str, str]) -> Model:
        session = self.session(tenant, session_id)
        if session.finished:
            raise ApiError(410, f"session {session_id} has finished", code="session_finished")
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise invalid(f"model_seq_id {model_seq_id} is already used in this session", "model_seq_id")
        held = sum(1 for model in self.models.values() if model.tenant == tenant and self._holds(model))
        if held >= self._limit(self.models_per_tenant, tenant):
            raise rate_limited(f"this tenant holds {held} training-API models, its limit; close a session or wait "
                               "for one to be released", code="too_many_models", retry_after=30.0)
        model = Model(model_id, tenant, session_id, base, shape, time.time(), user_metadata,
                      last_request=time.monotonic())
        self.models[model_id] = model
        session.models.append(model_id)
        return model

    def _holds(self, model: Model) -> bool:
        """Whether a model counts against its tenant's limit: one of a finished session, or released
        when idle with nothing waiting, does not (its state is kept; its next request brings it back)."""
        session = self.sessions.get(model.session_id)
        if session is None or session.finished:
            return False
        return model.hosted or bool(model.ready or model.buffered or model.running) or model.state_key is None

    def forget_model(self, model_id: str) -> None:
        model = self.models.pop(model_id, None)
        if model is not None:
            session = self.sessions.get(model.session_id)
            if session is not None and model_id in session.models:
                session.models.remove(model_id)

    def _admit(self, tenant: str) -> None:
        limit = self._limit(self.queued_per_tenant, tenant)
        if self._queued.get(tenant, 0) >= limit:
            raise rate_limited(f"this tenant has {limit} training-API requests waiting or running, "
                               "its limit; retry when some have finished", code="too_many_requests",
                               retry_after=RETRY_AFTER_S)

    def op(self, tenant: str, kind: str, model: str | None, payload: dict[str, Any], *, tokens: int = 0,
           after: Callable[[Op, dict[str, Any]], Awaitable[None]] | None = None) -> Op:
        self._admit(tenant)
        request_id = self._request_id()
        future = Future(request_id, tenant, kind)
        self.futures[request_id] = future
        self._queued[tenant] = self._queued.get(tenant, 0) + 1
        return Op(request_id, tenant, kind, model, payload, future, tokens, after)

    def submit(self, model: Model, seq_id: int | None, op: Op) -> Future:
        """`op` as `model`'s request `seq_id` (None: runs next, e.g. the op that creates the model)."""
        model.last_request = time.monotonic()
        if seq_id is None:
            model.ready.append(op)
        else:
            model.seen[seq_id] = op.future
            if seq_id < model.next_seq:  # its turn was skipped (a gap timed out): running it now reorders
                op.future.fail(f"request seq_id {seq_id} arrived after later requests of this model ran",
                               "user")
                self._queued[op.tenant] = max(0, self._queued.get(op.tenant, 1) - 1)
                return op.future
            if seq_id == model.next_seq:
                model.ready.append(op)
                model.next_seq = max(model.next_seq, seq_id + 1)
                self._drain(model)
            else:
                model.buffered[seq_id] = op
                if model.buffered_since is None:
                    model.buffered_since = time.monotonic()
        self._wake(model.base)
        return op.future

    def resent(self, model: Model, seq_id: int) -> Future | None:
        """The future of a request the client sends again with the same seq_id (its retry)."""
        return model.seen.get(seq_id)

    def _drain(self, model: Model) -> None:
        while model.next_seq in model.buffered:
            model.ready.append(model.buffered.pop(model.next_seq))
            model.next_seq += 1
        model.buffered_since = time.monotonic() if model.buffered else None

    def _skip_gaps(self) -> None:
        now = time.monotonic()
        for model in self.models.values():
            if model.buffered and model.buffered_since is not None and now - model.buffered_since >= GAP_S:
                model.next_seq = min(model.buffered)
                self._drain(model)

    def submit_to_pool(self, base: str, op: Op) -> Future:
        self._pool(base).ops.append(op)
        self._wake(base)
        return op.future

    # samplers ------------------------------------------------------------------------------------------
    def new_sampler(self, tenant: str, session_id: str, seq_id: int, base: str, model_path: str | None,
                    hosted_as: str | None) -> Sampler:
        session = self.session(tenant, session_id)
        sampler_id = f"{session_id}:sample:{seq_id}"
        if sampler_id in self.samplers:
            raise invalid(f"sampling_session_seq_id {seq_id} is already used in this session",
                          "sampling_session_seq_id")
        sampler = Sampler(sampler_id, tenant, session_id, base, model_path, hosted_as)
        self.samplers[sampler_id] = sampler
        session.samplers.append(sampler_id)
        return sampler

    def hold_sampler(self, sampler: Sampler) -> None:
        """`sampler` holds weights of its own in a worker: past the tenant's SAMPLERS_PER_TENANT, its
        oldest such sampler lets its weights go (sampling it is then refused, saying why)."""
        sampler.hosted_as = sampler.sampler_id
        held = sorted((s for s in self.samplers.values()
                       if s.tenant == sampler.tenant and s.hosted_as is not None and not s.retired),
                      key=lambda s: s.created)
        for old in held[:max(0, len(held) - SAMPLERS_PER_TENANT)]:
            old.retired = True
            drop = Op(f"drop-{uuid.uuid4().hex[:12]}", old.tenant, "drop", old.hosted_as, {},
                      Future("", old.tenant, "drop"))
            self.submit_to_pool(old.base, drop)

    # futures -------------------------------------------------------------------------------------------
    async def wait(self, future: Future, timeout_s: float) -> bool:
        if future.done.is_set():
            return True
        try:
            await asyncio.wait_for(future.done.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def expire(self) -> None:
        now = time.monotonic()
        for request_id in [rid for rid, fut in self.futures.items()
                           if fut.finished_at is not None and now - fut.finished_at > RESULT_TTL_S]:
            del self.futures[request_id]

    # the workers' side ---------------------------------------------------------------------------------
    def _pool(self, base: str) -> Pool:
        pool = self.pools.get(base)
        if pool is None:
            pool = Pool(f"pool-{uuid.uuid4().hex[:12]}", base, secrets.token_urlsafe(32))
            self.pools[base] = pool
            self._launch(pool)
        return pool

    def pool_by_id(self, pool_id: str, token: str) -> Pool:
        for pool in self.pools.values():
            if pool.pool_id == pool_id and secrets.compare_digest(pool.token.encode(), token.encode()):
                return pool
        raise unauthorized("invalid pool token", code="invalid_pool_token")

    def _wake(self, base: str) -> None:
        pool = self.pools.get(base)
        if pool is not None:
            pool.wake.set()
        else:
            self._pool(base)

    def cycle(self, pool: Pool) -> list[Op]:
        """The next cycle's ops: every ready op of a model not running one, forward_backward ops taken
        round-robin by tenant within the token budget (one at least), the pool's own ops."""
        if self.pools.get(pool.base) is not pool:
            return []  # a pool whose worker is gone (a request of it still held) takes nothing
        self._skip_gaps()
        heads = sorted((model for model in self.models.values()
                        if model.base == pool.base and model.running is None and model.ready),
                       key=lambda model: model.last_served)  # the longest unserved first
        chosen: list[Op] = []
        by_tenant: dict[str, deque[Model]] = {}
        for model in heads:
            if model.ready[0].kind in FB_KINDS:
                by_tenant.setdefault(model.tenant, deque()).append(model)
            else:
                chosen.append(model.ready.popleft())
        budget = self.cycle_tokens
        taken, count = 0, 0
        # tenants in turn, the one served longest ago first: each cycle starts with another tenant
        tenants = deque(sorted(by_tenant, key=lambda tenant: self._served.get(tenant, 0.0)))
        now = time.monotonic()
        while tenants:
            tenant = tenants.popleft()
            queue = by_tenant[tenant]
            op = queue[0].ready[0]
            if count and taken + op.tokens > budget:
                continue  # this tenant's next op waits for the next cycle; others may still fit
            served = queue.popleft()
            chosen.append(served.ready.popleft())
            served.last_served = now
            self._served[tenant] = now + count * 1e-9  # ties broken by the order served
            taken += op.tokens
            count += 1
            if queue:
                tenants.append(tenant)
        while pool.ops:
            chosen.append(pool.ops.popleft())
        for op in chosen:
            pool.running[op.op_id] = op
            model = self.models.get(op.model or "")
            if model is not None and op.kind != "sample":
                model.running = op
            self._restore_with(op)
        if chosen:
            pool.last_busy = time.monotonic()
        return chosen

    def _restore_with(self, op: Op) -> None:
        """An op for a model or sampler the worker does not hold carries where its state is: the
        worker loads it first (the control plane reads it into the op: `service.prepare`)."""
        if op.kind in ("create", "load"):
            return
        model = self.models.get(op.model or "")
        if model is not None and not model.hosted and model.state_key:
            op.payload["restore_key"] = model.state_key
        sampler = self.samplers.get(op.model or "")
        if sampler is not None and sampler.state_key and op.kind == "sample":
            op.payload["restore_key"] = sampler.state_key

    def hosted(self, name: str | None, held: bool) -> None:
        """The worker says whether it holds `name` after an op."""
        model = self.models.get(name or "")
        if model is not None:
            model.hosted = held
            if held:
                model.state_key = None  # the kept state is now behind the worker's: never go back to it

    def release_idle(self, idle_s: float) -> list[Op]:
        """Ops that let go of models idle for `idle_s` (their state kept in the store), and the pools
        idle that long told to stop."""
        now = time.monotonic()
        released = []
        for model in self.models.values():
            if (model.hosted and model.running is None and not model.ready and not model.buffered
                    and now - model.last_request >= idle_s):
                op = Op(f"release-{uuid.uuid4().hex[:12]}", model.tenant, "release", model.model_id, {},
                        Future("", model.tenant, "release"))
                model.ready.append(op)
                released.append(op)
                self._wake(model.base)
        for pool in list(self.pools.values()):
            busy = any(m.base == pool.base and (m.hosted or m.ready or m.running) for m in self.models.values())
            if not busy and not pool.ops and not pool.running and now - pool.last_busy >= idle_s \
                    and not pool.retiring:
                pool.retiring = True
                self._retire(pool)
        return released

    async def work(self, pool: Pool, results: list[dict[str, Any]]) -> list[Op]:
        """A worker's results of its last cycle in, its next cycle out (held up to WORK_WAIT_S)."""
        await self.report(pool, results)
        return await self.next_cycle(pool)

    async def report(self, pool: Pool, results: list[dict[str, Any]]) -> None:
        pool.last_seen = time.monotonic()
        for result in results:
            await self._finish(pool, result)

    async def next_cycle(self, pool: Pool) -> list[Op]:
        deadline = time.monotonic() + WORK_WAIT_S
        generation = pool.generation  # a request held here by a worker that has gone since takes nothing
        while not self.closed and not pool.stop and self.pools.get(pool.base) is pool \
                and pool.generation == generation:
            pool.wake.clear()
            ops = self.cycle(pool)
            if ops:
                return ops
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            try:
                await asyncio.wait_for(pool.wake.wait(), min(remaining, GAP_S))
            except asyncio.TimeoutError:
                pass
        return []

    async def _finish(self, pool: Pool, result: dict[str, Any]) -> None:
        op = pool.running.pop(str(result.get("op_id")), None)
        if op is None:
            return
        model = self.models.get(op.model or "")
        if model is not None and model.running is op:
            model.running = None
            model.last_request = time.monotonic()  # idle counts from the last op's end, not its start
        if "hosted" in result:
            self.hosted(op.model, bool(result["hosted"]))
        if op.request_id_counted():
            self._queued[op.tenant] = max(0, self._queued.get(op.tenant, 1) - 1)
        try:
            if not result.get("ok"):
                op.future.fail(str(result.get("error") or "the request failed"),
                               str(result.get("category") or "server"))
            elif op.after is not None:
                await op.after(op, result)
            elif result.get("proto") is not None:
                op.future.resolve(base64.b64decode(result["proto"]), PROTO)
            else:
                op.future.resolve(result.get("json") or {})
        except ApiError as exc:
            op.future.fail(exc.message, "user")
        except Exception:  # noqa: BLE001 - the platform's fault, logged with the op's id
            log.exception("training API: finishing op %s (%s) failed", op.op_id, op.kind)
            op.future.fail(f"the request could not be completed (request {op.op_id})", "server")
        if not op.future.done.is_set():
            op.future.fail("the request produced no result", "server")
        pool.wake.set()

    # requests nobody waits for any more -----------------------------------------------------------------
    def _drop(self, op: Op, message: str) -> None:
        op.future.fail(message, "user")
        if op.request_id_counted():
            self._queued[op.tenant] = max(0, self._queued.get(op.tenant, 1) - 1)

    def cancel(self, tenant: str, request_id: str) -> bool:
        """A sampling request its client abandoned (the SDK's `cancel_future`): dropped if no cycle
        took it yet (True); one a cycle took runs to its end. Only sampling requests are cancelled,
        as on the hosted service: a training op is part of its model's ordered sequence."""
        future = self.future(tenant, request_id)
        if future.kind != "sample":
            raise invalid("only sampling requests can be cancelled", "request_id")
        for pool in self.pools.values():
            for op in pool.ops:
                if op.op_id == request_id:
                    pool.ops.remove(op)
                    self._drop(op, "cancelled by the client")
                    return True
        return False

    def drop_lapsed(self) -> int:
        """The waiting requests of sessions whose client stopped beating (no heartbeat nor request
        for SESSION_GONE_S; the SDK beats every 10 s) are dropped, so that a client that died does
        not keep the shared workers busy; what a cycle already took finishes. The session itself
        goes on if its client comes back. How many were dropped."""
        now = time.monotonic()
        lapsed = {s.session_id for s in self.sessions.values()
                  if not s.finished and now - s.last_seen >= SESSION_GONE_S}
        if not lapsed:
            return 0
        message = (f"dropped: the session sent no heartbeat for {SESSION_GONE_S:.0f} s (its client stopped); "
                   "send the request again")
        dropped = 0
        for model in self.models.values():
            if model.session_id not in lapsed:
                continue
            waiting = [op for op in [*model.ready, *model.buffered.values()] if op.request_id_counted()]
            for op in waiting:
                self._drop(op, message)
            dropped += len(waiting)
            model.ready = deque(op for op in model.ready if not op.request_id_counted())
            model.buffered, model.buffered_since = {}, None
        for pool in self.pools.values():
            kept: deque[Op] = deque()
            for op in pool.ops:
                if op.session_id in lapsed and op.request_id_counted():
                    self._drop(op, message)
                    dropped += 1
                else:
                    kept.append(op)
            pool.ops = kept
        return dropped

    def handed_back(self, pool: Pool) -> None:
        """The worker stops (preempted) after its last results: what is still marked running was
        handed to a request of it that it gave up (a held request for work it abandoned on SIGTERM)
        and never ran: it goes back to the front of its queue for the next worker."""
        pool.generation += 1
        for op in reversed(list(pool.running.values())):
            model = self.models.get(op.model or "")
            if model is not None and model.running is op:
                model.running = None
                model.ready.appendleft(op)
            else:
                pool.ops.appendleft(op)
        pool.running.clear()
        pool.wake.set()  # a held request of the worker that left sees the change and takes nothing

    def attempt_started(self, pool: Pool, attempt: int) -> None:
        """A scheduled pool's worker of `attempt` asks for work: if another attempt served the pool
        before (it was preempted, or crashed, and the scheduler started the job again at once), that
        worker is gone (`_worker_gone`) before this one gets anything."""
        if attempt != pool.attempt:
            previous, pool.attempt = pool.attempt, attempt
            pool.generation += 1
            if previous:
                self._worker_gone(pool, f"attempt {previous} of its job ended")

    def attempt_ended(self, pool: Pool, attempt: int, why: str) -> None:
        """The attempt serving a scheduled pool ended and its job waits for GPUs again."""
        if attempt and attempt == pool.attempt:
            pool.attempt = 0
            pool.generation += 1
            self._worker_gone(pool, why)

    def worker_lost(self, pool: Pool, why: str) -> None:
        """The pool's worker is gone for good (`_worker_gone`); a pool with work waiting starts again."""
        self._worker_gone(pool, why)
        if self.pools.get(pool.base) is pool:
            del self.pools[pool.base]
        if not self.closed and (any(m.base == pool.base and m.ready for m in self.models.values()) or pool.ops):
            replacement = self._pool(pool.base)
            replacement.ops.extend(pool.ops)
            replacement.wake.set()

    def _worker_gone(self, pool: Pool, why: str) -> None:
        """What the worker was running fails (the platform's fault, the client may retry). Its models
        are kept: one whose state was kept (idle release, preemption) is loaded from it by the next
        worker before its next op; one without any kept state cannot go on, so its waiting ops fail,
        saying to load it from a checkpoint."""
        for op in list(pool.running.values()):
            op.future.fail(f"the training worker stopped ({why}); retry the request", "server")
            if op.request_id_counted():
                self._queued[op.tenant] = max(0, self._queued.get(op.tenant, 1) - 1)
            model = self.models.get(op.model or "")
            if model is not None and model.running is op:
                model.running = None
        pool.running.clear()
        for model in [m for m in self.models.values() if m.base == pool.base]:
            model.hosted = False
            if model.state_key:
                continue
            for op in [*model.ready, *model.buffered.values()]:
                if op.kind in ("create", "load"):
                    continue  # the model is (re)made by its op: nothing was lost
                op.future.fail(f"the training worker stopped ({why}) before this model's state was kept; "
                               "load it from a checkpoint", "server")
                if op.request_id_counted():
                    self._queued[op.tenant] = max(0, self._queued.get(op.tenant, 1) - 1)
                model.ready = deque(o for o in model.ready if o is not op)
                model.buffered = {k: o for k, o in model.buffered.items() if o is not op}


def stop_now(pool: Pool) -> None:
    pool.stop = True
    pool.wake.set()
