"""The training API's use cases (Tinker's wire): what each route asks of the broker, the object
store and the base-model registry. Routes call these on the event loop; store and database work
goes to threads.

Checkpoints live under the tenant's prefix (`storage/layout.training_checkpoint_prefix`): the
training state (adapter and optimizer, `state.pt`), the adapter in PEFT's format
(`adapter_model.safetensors`, `adapter_config.json`) and `checkpoint.json`, written last: a
checkpoint without it does not exist. A `tinker://` path names a run and a checkpoint; it is
looked up under the caller's own prefix only, so another tenant's path is simply not found.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from tuneforge.domain import tinker_wire as wire
from tuneforge.domain.errors import ApiError, invalid
from tuneforge.services.training_api import runs
from tuneforge.services.training_api.broker import SAMPLERS_PER_TENANT, Broker, Future, Model, Op
from tuneforge.services.training_api.runs import RECORD_NAME, _iso
from tuneforge.storage import layout

MAX_RANK = 128
LOSS_FUNCTIONS = ("cross_entropy", "importance_sampling", "ppo")
SDK_LOSS_FUNCTIONS = ("cispo", "dro", "gspo", "stable_reinforce", "custom")
MAX_SAMPLES = 128
MAX_SAMPLE_TOKENS = 8192
_NAME = re.compile(r"^(?!\.+$)[A-Za-z0-9._-]{1,128}$")  # not "." nor "..": no key holds those
STATE_NAME, PEFT_WEIGHTS, PEFT_CONFIG = "state.pt", "adapter_model.safetensors", "adapter_config.json"


class TrainingApi:
    def __init__(self, platform: Any, broker: Broker) -> None:
        self.platform = platform
        self.broker = broker

    # base models ---------------------------------------------------------------------------------------
    async def base(self, name: str, param: str = "base_model") -> Any:
        from tuneforge.services.serving import base_models

        def find() -> Any:
            with self.platform.db.session() as session:
                row = base_models.find(session, name)
                if row is not None:
                    session.expunge(row)
                return row

        row = await run_in_threadpool(find)
        if row is None:
            raise invalid(f"{param} {name!r} is not a registered base model", param, "model_not_found")
        return row

    async def capabilities(self) -> dict[str, Any]:
        from tuneforge.services.serving import base_models

        def rows() -> list[Any]:
            with self.platform.db.session() as session:
                return [(row.name, row.max_position_embeddings) for row in base_models.list_base_models(session)]

        return {"supported_models": [{"model_name": name, "max_context_length": length, "trainable": True,
                                      "sampleable": True} for name, length in await run_in_threadpool(rows)]}

    # models --------------------------------------------------------------------------------------------
    async def create_model(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise invalid(f"optimizer_config.type {optimizer!r} is not supported; use adamw", "optimizer_config.type")
        lora = body.get("lora_config") or {}
        rank = lora.get("rank", 32)
        if not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
            raise invalid(f"lora_config.rank must be an integer from 1 to {MAX_RANK}", "lora_config.rank")
        shape = {"rank": rank, "seed": lora.get("seed"), "train_attn": bool(lora.get("train_attn", True)),
                 "train_mlp": bool(lora.get("train_mlp", True)), "train_unembed": bool(lora.get("train_unembed", True))}
        if not (shape["train_attn"] or shape["train_mlp"] or shape["train_unembed"]):
            raise invalid("lora_config trains nothing: set train_attn, train_mlp or train_unembed", "lora_config")
        row = await self.base(str(body.get("base_model") or ""))
        model = self.broker.new_model(tenant, str(body.get("session_id")), int(body.get("model_seq_id", 0)),
                                      row.name, shape, dict(body.get("user_metadata") or {}))
        model.base_sha256 = row.sha256
        await self._write_run(model)
        op = self.broker.op(tenant, "create", model.model_id, {"shape": shape}, after=self._created)
        self.broker.submit(model, None, op)
        return {"request_id": op.op_id, "model_id": model.model_id}

    async def _created(self, op: Op, result: dict[str, Any]) -> None:
        op.future.resolve({"model_id": op.model, "type": "create_model"})

    async def _write_run(self, model: Model) -> None:
        record = {"training_run_id": model.model_id, "base_model": model.base, "model_owner": model.tenant,
                  "is_lora": True, "lora_rank": model.shape["rank"], "shape": model.shape,
                  "base_sha256": model.base_sha256,
                  "created": model.created, "last_request_time": time.time(),
                  "user_metadata": model.user_metadata or None, "session_id": model.session_id}
        key = layout.training_run_key(model.tenant, model.model_id)
        await run_in_threadpool(self.platform.store.put_bytes, key, json.dumps(record).encode())

    async def info(self, tenant: str, model_id: str) -> dict[str, Any]:
        """The model as the SDK's `get_info` reads it. `tokenizer_id`: what the base was registered
        from (a hub id, or a folder of the control plane's host), which `TrainingClient.get_tokenizer`
        loads with transformers (the SDK cuts it at its first ':')."""
        model = self.broker.model(tenant, model_id)
        row = await self.base(model.base)
        return {"type": "get_info", "model_id": model.model_id, "is_lora": True, "lora_rank": model.shape["rank"],
                "model_name": model.base, "optimizer_config": {"type": "adamw"},
                "model_data": {"arch": "causal_lm", "model_name": model.base, "tokenizer_id": row.source or None}}

    def _ordered(self, tenant: str, model_id: str, seq_id: Any) -> tuple[Model, int | None, Future | None]:
        model = self.broker.model(tenant, model_id)
        seq = int(seq_id) if isinstance(seq_id, int) else None
        resent = self.broker.resent(model, seq) if seq is not None else None
        return model, seq, resent

    @staticmethod
    def _submitted(model: Model, future: Future) -> dict[str, Any]:
        return {"request_id": future.request_id, "model_id": model.model_id}

    async def forward_backward(self, tenant: str, body: bytes) -> dict[str, Any]:
        try:
            request = await run_in_threadpool(wire.decode_forward_backward, body)
        except wire.WireError as exc:
            raise invalid(f"the forward_backward body is not a ForwardBackwardRequest message: {exc}", "body") from None
        model, seq, resent = self._ordered(tenant, request.model_id, request.seq_id)
        if resent is not None:
            return self._submitted(model, resent)
        if request.loss_fn in SDK_LOSS_FUNCTIONS or request.loss_fn not in LOSS_FUNCTIONS:
            raise invalid(f"loss_fn {request.loss_fn!r} is not supported; use one of {', '.join(LOSS_FUNCTIONS)} "
                          "(or forward_backward_custom, which runs on the client)", "loss_fn", "unsupported_loss_fn")
        if request.loss_fn_config_text:
            raise invalid("loss_fn_config_v2 text values are not supported", "loss_fn_config_v2")
        tokens = sum(len(datum.tokens) for datum in request.data)
        op = self.broker.op(tenant, "forward_backward", model.model_id, {"body": base64.b64encode(body).decode()},
                            tokens=tokens, after=None if request.forward_only else self._trained(tokens))
        return self._submitted(model, self.broker.submit(model, seq, op))

    def _trained(self, tokens: int) -> Any:
        async def meter(op: Op, result: dict[str, Any]) -> None:
            base = self.broker.models[op.model].base if op.model in self.broker.models else ""
            await self._meter(op.tenant, op.model, base, "training.train", prompt=tokens, completion=0,
                              seconds=result.get("seconds"))
            op.future.resolve(base64.b64decode(result["proto"]), "application/x-protobuf")
        return meter

    async def _meter(self, tenant: str, model: str | None, base: str, kind: str, *, prompt: int,
                     completion: int, seconds: float | None) -> None:
        from tuneforge.services.tenancy.usage import meter_tokens

        def write() -> None:
            with self.platform.db.session() as session:
                meter_tokens(session, tenant, model, kind, base, requests=1, prompt_tokens=prompt,
                             completion_tokens=completion, now=time.time(),
                             device_seconds=None if seconds is None else float(seconds))

        await run_in_threadpool(write)

    async def optim_step(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        model, seq, resent = self._ordered(tenant, str(body.get("model_id")), body.get("seq_id"))
        if resent is not None:
            return self._submitted(model, resent)
        if "optimizer_params" in body and "adam_params" not in body:
            raise invalid("only Adam is supported here: send adam_params", "optimizer_params")
        adam = dict(body.get("adam_params") or {})
        allowed = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"}
        params = {key: float(value) for key, value in adam.items() if key in allowed and value is not None}
        op = self.broker.op(tenant, "optim_step", model.model_id, {"adam": params})
        return self._submitted(model, self.broker.submit(model, seq, op))

    # checkpoints ---------------------------------------------------------------------------------------
    def _checkpoint_name(self, value: Any, param: str = "path") -> str:
        name = str(value or "")
        if not _NAME.match(name):
            raise invalid(f"{param} must be 1-128 letters, digits, '.', '_' or '-'", param)
        return name

    async def save_weights(self, tenant: str, body: dict[str, Any], *, for_sampler: bool) -> dict[str, Any]:
        model, seq, resent = self._ordered(tenant, str(body.get("model_id")), body.get("seq_id"))
        if resent is not None:
            return self._submitted(model, resent)
        ttl = body.get("ttl_seconds")
        if for_sampler and body.get("path") is None:  # an ephemeral sampler of the current weights
            sampling_seq = body.get("sampling_session_seq_id")
            if not isinstance(sampling_seq, int):
                raise invalid("save_weights_for_sampler needs a path or a sampling_session_seq_id", "path")
            sampler = self.broker.new_sampler(tenant, model.session_id, sampling_seq, model.base, None, None)
            self.broker.hold_sampler(sampler)
            op = self.broker.op(tenant, "snapshot", model.model_id, {"as": sampler.sampler_id},
                                after=self._snapshot_done(sampler.sampler_id))
            return self._submitted(model, self.broker.submit(model, seq, op))
        name = self._checkpoint_name(body.get("path"))
        kind = "sampler_weights" if for_sampler else "weights"
        prefix = layout.training_checkpoint_prefix(tenant, model.model_id, kind, name)
        if not body.get("overwrite", True) and await run_in_threadpool(
                self.platform.store.exists, f"{prefix}/{RECORD_NAME}"):
            raise invalid(f"a checkpoint named {name!r} exists; pass overwrite=true to replace it", "path")
        meta = {"ttl_seconds": ttl if isinstance(ttl, int) else None,
                "user_metadata": dict(body.get("user_metadata") or {}) or None}
        op = self.broker.op(tenant, "save", model.model_id, {"peft": True},
                            after=self._saved(model, kind, name, prefix, meta))
        return self._submitted(model, self.broker.submit(model, seq, op))

    def _snapshot_done(self, sampler_id: str) -> Any:
        async def done(op: Op, result: dict[str, Any]) -> None:
            op.future.resolve({"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})
        return done

    def _saved(self, model: Model, kind: str, name: str, prefix: str, meta: dict[str, Any]) -> Any:
        async def write(op: Op, result: dict[str, Any]) -> None:
            tinker_path = f"tinker://{model.model_id}/{kind}/{name}"
            state = base64.b64decode(result["state"])
            weights = base64.b64decode(result["peft_weights"])
            now = time.time()
            record = {"checkpoint_id": f"{kind}/{name}",
                      "checkpoint_type": "training" if kind == "weights" else "sampler",
                      "time": _iso(now), "tinker_path": tinker_path, "size_bytes": len(state) + len(weights),
                      "public": False, "user_metadata": meta["user_metadata"],
                      "expires_at": _iso(now + meta["ttl_seconds"]) if meta["ttl_seconds"] else None,
                      "run_id": model.model_id, "base_model": model.base, "base_sha256": model.base_sha256,
                      "shape": model.shape}
            store = self.platform.store

            def put() -> None:
                store.put_bytes(f"{prefix}/{STATE_NAME}", state)
                store.put_bytes(f"{prefix}/{PEFT_WEIGHTS}", weights)
                store.put_bytes(f"{prefix}/{PEFT_CONFIG}", json.dumps(result["peft_config"]).encode())
                store.put_bytes(f"{prefix}/{RECORD_NAME}", json.dumps(record).encode())

            await run_in_threadpool(put)
            if kind == "weights":
                model.last_checkpoint = record
            else:
                model.last_sampler_checkpoint = record
            op.future.resolve({"path": tinker_path, "type": "save_weights"} if kind == "weights"
                              else {"path": tinker_path, "type": "save_weights_for_sampler"})
        return write

    async def checkpoint(self, tenant: str, tinker_path: Any, param: str = "path") -> tuple[dict[str, Any], str]:
        """The caller's checkpoint at `tinker_path`: its record and its prefix (404 when it has none)."""
        return await run_in_threadpool(runs.checkpoint_at, self.platform.store, tenant, tinker_path, param)

    async def load_weights(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        record, prefix = await self.checkpoint(tenant, body.get("path"))
        state = await run_in_threadpool(self.platform.store.get_bytes, f"{prefix}/{STATE_NAME}")
        with_optimizer = bool(body.get("optimizer", False))
        payload = {"state": base64.b64encode(state).decode(), "optimizer": with_optimizer}
        if body.get("model_id"):  # into the caller's current model
            model, seq, resent = self._ordered(tenant, str(body["model_id"]), body.get("seq_id"))
            if resent is not None:
                return self._submitted(model, resent)
            if record["base_model"] != model.base:
                raise invalid(f"the checkpoint is of base {record['base_model']}, this model of {model.base}", "path")
            model.shape = record["shape"]
            op = self.broker.op(tenant, "load", model.model_id, payload, after=self._loaded(body["path"]))
            return self._submitted(model, self.broker.submit(model, seq, op))
        base = str(body.get("base_model") or record["base_model"])
        if base != record["base_model"]:
            raise invalid(f"the checkpoint is of base {record['base_model']}", "base_model")
        model = self.broker.new_model(tenant, str(body.get("session_id")), int(body.get("model_seq_id", 0)),
                                      base, dict(record["shape"]), dict(body.get("user_metadata") or {}))
        await self._write_run(model)
        op = self.broker.op(tenant, "load", model.model_id, payload, after=self._loaded(body["path"]))
        self.broker.submit(model, None, op)
        return self._submitted(model, op.future)

    @staticmethod
    def _loaded(path: str) -> Any:
        async def done(op: Op, result: dict[str, Any]) -> None:
            op.future.resolve({"path": path, "model_id": op.model, "type": "load_weights"})
        return done

    # sampling ------------------------------------------------------------------------------------------
    async def create_sampling_session(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id, seq = str(body.get("session_id")), body.get("sampling_session_seq_id")
        if not isinstance(seq, int):
            raise invalid("sampling_session_seq_id must be an integer", "sampling_session_seq_id")
        if body.get("model_path"):
            record, prefix = await self.checkpoint(tenant, body["model_path"], "model_path")
            state = await run_in_threadpool(self.platform.store.get_bytes, f"{prefix}/{STATE_NAME}")
            sampler = self.broker.new_sampler(tenant, session_id, seq, record["base_model"], body["model_path"], None)
            self.broker.hold_sampler(sampler)
            op = self.broker.op(tenant, "load", sampler.sampler_id,
                                {"state": base64.b64encode(state).decode(), "optimizer": False})
            future = self.broker.submit_to_pool(sampler.base, op)
            if not await self.broker.wait(future, 120.0) or future.error:
                raise ApiError(503, "the sampler could not be loaded; retry", type="server_error",
                               code="sampler_unavailable", retry_after=2.0)
        else:
            row = await self.base(str(body.get("base_model") or ""))
            sampler = self.broker.new_sampler(tenant, session_id, seq, row.name, None, None)
        return {"sampling_session_id": sampler.sampler_id, "type": "create_sampling_session"}

    def sampler_info(self, tenant: str, sampler_id: str) -> dict[str, Any]:
        sampler = self.broker.sampler(tenant, sampler_id)
        return {"sampler_id": sampler.sampler_id, "base_model": sampler.base, "model_path": sampler.model_path}

    async def sample(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        sampler = self.broker.sampler(tenant, str(body.get("sampling_session_id")))
        if sampler.retired:
            raise invalid(f"sampling session {sampler.sampler_id}'s weights were let go: a tenant holds at most "
                          f"{SAMPLERS_PER_TENANT} samplers of its own weights at once; save weights for a sampler "
                          "again", "sampling_session_id")
        seq = body.get("seq_id")
        if isinstance(seq, int) and seq in sampler.seen:
            future, ids = sampler.seen[seq]
            return {"request_id": future.request_id, "sample_sequence_ids": ids}
        num = body.get("num_samples", 1)
        if not isinstance(num, int) or not 1 <= num <= MAX_SAMPLES:
            raise invalid(f"num_samples must be an integer from 1 to {MAX_SAMPLES}", "num_samples")
        for unsupported in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(unsupported):
                raise invalid(f"{unsupported} is not supported here", unsupported)
        if body.get("target_prompt_logprobs") is not None or body.get("prompt_logprobs_last_n") is not None:
            raise invalid("target_prompt_logprobs and prompt_logprobs_last_n are not supported here",
                          "prompt_logprobs_last_n")
        prompt: list[int] = []
        for index, chunk in enumerate((body.get("prompt") or {}).get("chunks") or []):
            if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
                raise invalid("only encoded_text chunks are served here", f"prompt.chunks[{index}]")
            tokens = chunk.get("tokens") or []
            if not all(isinstance(token, int) for token in tokens):
                raise invalid("tokens must be integers", f"prompt.chunks[{index}].tokens")
            prompt.extend(tokens)
        if not prompt:
            raise invalid("prompt is empty", "prompt")
        params = body.get("sampling_params") or {}
        max_tokens = params.get("max_tokens") or 256
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_SAMPLE_TOKENS:
            raise invalid(f"sampling_params.max_tokens must be from 1 to {MAX_SAMPLE_TOKENS}",
                          "sampling_params.max_tokens")
        stop = params.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, (str, int)) for s in stop)):
            raise invalid("sampling_params.stop must be a string, a list of strings or a list of token ids",
                          "sampling_params.stop")
        seed = params.get("seed")
        sampling = {"max_tokens": max_tokens, "temperature": float(params.get("temperature", 1.0)),
                    "top_k": int(params.get("top_k", -1)), "top_p": float(params.get("top_p", 1.0)),
                    "stop": stop, "seed": int(seed) if isinstance(seed, int) else None}
        op = self.broker.op(tenant, "sample", sampler.hosted_as,
                            {"prompt": prompt, "num_samples": num, "sampling_params": sampling,
                             "prompt_logprobs": bool(body.get("prompt_logprobs"))}, after=self._sampled(sampler.base))
        op.session_id = sampler.session_id
        ids = [f"{sampler.sampler_id}:{seq}:{op.op_id}:{index}" for index in range(num)]
        if isinstance(seq, int):
            sampler.seen[seq] = (op.future, ids)
        self.broker.submit_to_pool(sampler.base, op)
        return {"request_id": op.op_id, "sample_sequence_ids": ids}

    def _sampled(self, base: str) -> Any:
        async def meter(op: Op, result: dict[str, Any]) -> None:
            await self._meter(op.tenant, op.model, base, "training.sample", prompt=int(result.get("prefill", 0)),
                              completion=int(result.get("tokens", 0)), seconds=result.get("seconds"))
            op.future.resolve(base64.b64decode(result["proto"]), "application/x-protobuf")
        return meter

    # the workers' side ----------------------------------------------------------------------------------
    async def work(self, pool: Any, body: dict[str, Any]) -> dict[str, Any]:
        """A worker's request: its last cycle's results (and, when it is stopping, the state of every
        model it holds, kept so that the next worker goes on from there), its next cycle back."""
        await self.broker.report(pool, list(body.get("results") or []))
        states = body.get("states") or {}
        if states:
            await self._keep(states)
        if body.get("stopping"):
            self.broker.handed_back(pool)
            return {"ops": [], "stop": True}
        if self.broker.closed:
            return {"ops": [], "stop": True}
        ops = await self.broker.next_cycle(pool)
        if not ops and (pool.stop or self.broker.closed):
            return {"ops": [], "stop": True}
        await self._prepare(ops)
        return {"ops": [op.wire() for op in ops]}

    async def _keep(self, states: dict[str, str]) -> None:
        store = self.platform.store
        for name, encoded in states.items():
            model = self.broker.models.get(name)
            sampler = self.broker.samplers.get(name)
            owner = model or sampler
            if owner is None:
                continue
            key = layout.training_state_key(owner.tenant, name)
            await run_in_threadpool(store.put_bytes, key, base64.b64decode(encoded))
            owner.state_key = key
            if model is not None:
                model.hosted = False

    async def _prepare(self, ops: list[Op]) -> None:
        """Ops that must first load a kept state get its bytes (a worker reads no tenant's objects)."""
        for op in ops:
            key = op.payload.pop("restore_key", None)
            if key is None:
                continue
            try:
                state = await run_in_threadpool(self.platform.store.get_bytes, key)
            except (FileNotFoundError, KeyError):
                continue  # the op fails in the worker: its model is not there
            op.payload["restore"] = {"state": base64.b64encode(state).decode(), "optimizer": True}

    async def housekeeping(self, every_s: float = 10.0) -> None:
        """Forever, on the event loop: models idle past `training_api_idle_s` are released (their state
        kept), pools idle that long stop, the waiting requests of sessions whose client stopped beating are
        dropped, finished futures expire."""
        idle_s = self.platform.settings.training_api_idle_s
        while not self.broker.closed:
            await asyncio.sleep(min(every_s, idle_s / 2))
            for op in self.broker.release_idle(idle_s):
                op.after = self._released
            self.broker.drop_lapsed()
            self.broker.expire()

    async def _released(self, op: Op, result: dict[str, Any]) -> None:
        await self._keep({str(op.model): result["state"]})
        op.future.resolve({})

    # REST ----------------------------------------------------------------------------------------------
    async def weights_info(self, tenant: str, tinker_path: Any) -> dict[str, Any]:
        record, _prefix = await self.checkpoint(tenant, tinker_path, "tinker_path")
        shape = record["shape"]
        return {"base_model": record["base_model"], "is_lora": True, "lora_rank": shape["rank"],
                "train_unembed": shape["train_unembed"], "train_mlp": shape["train_mlp"],
                "train_attn": shape["train_attn"], "optimizer_config": {"type": "adamw"}}

    async def rest(self, function: Any, tenant: str, *args: Any) -> Any:
        return await run_in_threadpool(function, self.platform.store, tenant, *args)

    async def training_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        model = self.broker.models.get(run_id)
        last = None
        if model is not None and model.tenant == tenant:
            last = time.time() - (time.monotonic() - model.last_request)
        return await self.rest(runs.training_run, tenant, run_id, last)
