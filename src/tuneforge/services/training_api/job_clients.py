"""Small ordinary jobs as clients of their base model's shared co-training worker.

A job that planning put on the shared pool (`resources.shared_pool`: a small supervised LoRA job
within the operator's `pool_jobs_max_*`) runs its attempt without GPUs (`train/pool_client.py`):
the attempt tokenizes its data, orders its batches and keeps its checkpoints, and asks this
module, with its job token, to run each step on the shared worker — one forward_backward and
one optim_step of its own model, batched with every other model's requests of the cycle.

    POST /internal/v1/pools/jobs/{job_id}/{action}     (the attempt's job token)
      open              a fresh model of the job's LoRA shape, or the state of its checkpoint
      forward_backward  {data: [{tokens, target_tokens, weights}], forward_only} -> {loss_sum, tokens}
      optim_step        {adam: {...}} -> {metrics}
      save              -> {state, peft_weights, peft_config} (base64), which the attempt writes
                           into its own checkpoint or artifact folder
      close             the model leaves the worker
      wait              {request_id}: a request that took longer than one answer's wait

The model's shape comes from the job's row (rank, alpha, seed), never from the request; only the
current attempt's token counts, and only for its own job's model, so a trainer reaches nothing
else on the pool. Its steps are metered to the job (`training.train`: tokens and the worker's
device seconds), at the training API's prices; the attempt itself holds no GPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from tuneforge.domain.errors import ApiError, invalid, not_found
from tuneforge.services.training_api.broker import Future, Model, Op

ANSWER_WAIT_S = 20.0  # a request is answered when done or after this long with {"pending": request_id}
MAX_ROWS = 4096  # rows of one forward_backward
KEEP_SEEN = 8  # requests remembered by their `seq`
ACTIONS = ("open", "forward_backward", "optim_step", "save", "close", "wait")


@dataclass
class Client:
    job_id: str
    tenant: str
    attempt: int
    base: str
    base_sha256: str
    shape: dict[str, Any]
    model: Model | None = None
    seen: dict[int, Future] = field(default_factory=dict)  # the last requests by their `seq`: a retry's answer
    seq: int | None = None  # the `seq` of the request being submitted


class JobClients:
    def __init__(self, training: Any) -> None:
        self.training = training  # the TrainingApi (service.py): its broker, platform and metering
        self.clients: dict[str, Client] = {}

    @property
    def broker(self) -> Any:
        return self.training.broker

    async def handle(self, job_id: str, action: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        if action not in ACTIONS:
            raise not_found(f"no pool action {action!r}", "action")
        client = await self._client(job_id, token)
        if action == "open":
            return await self._open(client, body)
        if action == "wait":
            future = self.broker.future(client.tenant, str(body.get("request_id")))
            return await self._answer(future)
        model = client.model
        if model is None or model.model_id not in self.broker.models:
            raise ApiError(409, "the job's model is not open on the pool; open it again", code="pool_model_gone")
        seq = body.get("seq")
        if isinstance(seq, int) and seq in client.seen:  # the attempt's retry of a request that was submitted
            return await self._answer(client.seen[seq])
        if isinstance(seq, int) and action != "close":
            client.seq = seq
        if action == "forward_backward":
            return await self._forward_backward(client, model, body)
        if action == "optim_step":
            adam = {key: float(value) for key, value in dict(body.get("adam") or {}).items()
                    if key in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")}
            return await self._run(model, self.broker.op(client.tenant, "optim_step", model.model_id, {"adam": adam}),
                                   client)
        if action == "save":
            return await self._run(model, self.broker.op(client.tenant, "save", model.model_id, {"peft": True},
                                                         after=_saved), client)
        self.close(job_id)
        return {}

    async def _client(self, job_id: str, token: str) -> Client:
        """The job's client for the attempt whose job token `token` is, while that attempt runs."""
        digest = hashlib.sha256(token.encode()).hexdigest()

        def check() -> Client | None:
            from tuneforge.db.repos import pool_jobs

            with self.training.platform.db.session() as session:
                attempt = pool_jobs.current_attempt(session, job_id, digest)
                if attempt is None:
                    return None
                job = pool_jobs.by_id(session, job_id)
                resolved = job.resolved if job is not None else None
                if job is None or resolved is None or not resolved.resources.shared_pool:
                    return None
                lora = resolved.lora
                shape = {"rank": int(lora.rank), "alpha": float(lora.alpha), "seed": int(job.seed),
                         "train_attn": True, "train_mlp": True, "train_unembed": False}
                return Client(job_id, job.tenant_id, attempt.number, job.model, job.base_model_sha256 or "", shape)

        known = self.clients.get(job_id)
        fresh = await run_in_threadpool(check)
        if fresh is None:
            raise ApiError(401, "invalid job token, or the attempt is no longer current", code="invalid_job_token")
        if known is not None and known.attempt == fresh.attempt:
            return known
        if known is not None:  # a new attempt: what the previous one left on the pool goes
            self.close(job_id)
        self.clients[job_id] = fresh
        return fresh

    async def _open(self, client: Client, body: dict[str, Any]) -> dict[str, Any]:
        if client.model is not None:
            self.close(client.job_id)
            self.clients[client.job_id] = client
        session = self.broker.create_session(client.tenant, [f"job:{client.job_id}"], {"job_id": client.job_id})
        model = self.broker.new_model(client.tenant, session.session_id, 0, client.base, dict(client.shape),
                                      {"job_id": client.job_id})
        model.base_sha256 = client.base_sha256
        client.model = model
        state = body.get("state")
        if state is not None:
            if not isinstance(state, str):
                raise invalid("state must be the base64 of a checkpoint's pool state", "state")
            op = self.broker.op(client.tenant, "load", model.model_id, {"state": state, "optimizer": True})
        else:
            op = self.broker.op(client.tenant, "create", model.model_id, {"shape": dict(client.shape)})
        answer = await self._run(model, op)
        return {**answer, "model_id": model.model_id}

    async def _forward_backward(self, client: Client, model: Model, body: dict[str, Any]) -> dict[str, Any]:
        rows = body.get("data")
        if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_ROWS:
            raise invalid(f"data must be a list of 1 to {MAX_ROWS} rows", "data")
        data = []
        for index, row in enumerate(rows):
            tokens = row.get("tokens") if isinstance(row, dict) else None
            targets = row.get("target_tokens") if isinstance(row, dict) else None
            weights = row.get("weights") if isinstance(row, dict) else None
            if not (isinstance(tokens, list) and isinstance(targets, list) and isinstance(weights, list)) or \
                    not len(tokens) == len(targets) == len(weights):
                raise invalid(f"data[{index}] needs tokens, target_tokens and weights of one length", f"data[{index}]")
            data.append({"tokens": tokens, "target_tokens": targets, "weights": weights})
        tokens = sum(len(row["tokens"]) for row in data)
        forward_only = bool(body.get("forward_only"))
        op = self.broker.op(client.tenant, "forward_backward", model.model_id,
                            {"data": data, "loss_fn": "cross_entropy", "forward_only": forward_only},
                            tokens=tokens, after=self._passed(client, tokens, forward_only))
        return await self._run(model, op, client)

    def _passed(self, client: Client, tokens: int, forward_only: bool) -> Any:
        async def done(op: Op, result: dict[str, Any]) -> None:
            if not forward_only:  # the job's share of the worker, billed to the job
                await self.training._meter(op.tenant, client.job_id, client.base, "training.train", prompt=tokens,
                                           completion=0, seconds=result.get("seconds"))
            metrics = dict(result.get("metrics") or {})
            op.future.resolve({"loss_sum": float(metrics.get("loss:sum", 0.0)), "tokens": tokens})
        return done

    async def _run(self, model: Model, op: Op, client: Client | None = None) -> dict[str, Any]:
        self.broker.submit(model, None, op)
        if client is not None and client.seq is not None:
            client.seen[client.seq] = op.future
            for old in [number for number in client.seen if number <= client.seq - KEEP_SEEN]:
                del client.seen[old]
            client.seq = None
        return await self._answer(op.future)

    async def _answer(self, future: Future) -> dict[str, Any]:
        if not await self.broker.wait(future, ANSWER_WAIT_S):
            return {"pending": future.request_id}
        if future.error:
            status = 400 if future.category == "user" else 503
            raise ApiError(status, future.error, code="pool_request_failed",
                           retry_after=None if status == 400 else 2.0)
        body = future.body
        return dict(body) if isinstance(body, dict) else {}

    def close(self, job_id: str) -> None:
        """The job's model leaves the pool (its attempt ended, or a new one took over)."""
        client = self.clients.pop(job_id, None)
        if client is None or client.model is None:
            return
        model = client.model
        session = self.broker.sessions.get(model.session_id)
        if session is not None:
            session.finished = True
        if model.model_id not in self.broker.models:
            return
        if not (model.hosted or model.running or model.ready):
            self.broker.forget_model(model.model_id)
            return
        self.broker.submit(model, None, self.broker.op(client.tenant, "drop", model.model_id, {}, after=self._forget))

    async def _forget(self, op: Op, result: dict[str, Any]) -> None:
        self.broker.forget_model(op.model or "")
        op.future.resolve({})


async def _saved(op: Op, result: dict[str, Any]) -> None:
    op.future.resolve({"state": result["state"], "peft_weights": result.get("peft_weights"),
                       "peft_config": result.get("peft_config")})
