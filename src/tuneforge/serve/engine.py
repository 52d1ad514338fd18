"""The inference engine: base models loaded once, fine-tuned adapters hot-swapped on them.

One loaded base model per base SHA (at most `max_models`, least recently used
evicted). The first adapter wraps it in a PEFT model, once; later adapters are
loaded into that same model by name, and a request selects its adapter
(`set_adapter`) or, for the base alone, runs with the adapters switched off
(`disable_adapter()`). Each base keeps at most `max_adapters` adapters; loading
one more deletes the least recently used from the model. Adapter files are
downloaded from the object store once, into a local cache folder.

A full fine-tune holds complete weights: it is loaded as a model of its own and
counts against `max_models` like a base.

Each loaded model has a `ModelBatcher` (serve/batching.py): one thread that
alone runs the model, decoding every request on it in the same forward pass
(continuous batching, mixed adapters in one batch) and loading adapters
between steps. Requests wait in its bounded per-tenant queue, and a tenant over
its fair share of the batch's rows gives rows back to the others waiting.

Each tenant's generation work in flight on this engine (Σ n × max_tokens of its
queued and running requests) is bounded per tier (`serve/budget.py`): a request
reserves all of it at once through `TenantEngine.reserve`, or more answers 429.

This module imports torch; nothing imports it until the first inference
request (`services.context.Platform.inference_engine`).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tuneforge.domain.errors import ApiError, invalid
from tuneforge.modeling.base import load_base_model
from tuneforge.serve.batching import ModelBatcher, Request
from tuneforge.serve.budget import Lease, TokenBudget
from tuneforge.serve.generation import prompt_token_ids
from tuneforge.serve.lora_bank import LoraBank
from tuneforge.serve.params import (
    FULL_MODEL,
    Chunk,
    Completion,
    ModelTarget,
    Prompt,
    SamplingParams,
)
from tuneforge.serve.sinks import Sink
from tuneforge.settings import Settings
from tuneforge.storage import layout
from tuneforge.storage.model_cache import fetch_base_model
from tuneforge.storage.store import ObjectStore

log = logging.getLogger(__name__)

_COMPLETE_MARKER = layout.COMPLETE_NAME
RETRY_AFTER_MAX_S = 60.0  # a Retry-After for tokens in flight says at most this; the tenant may try sooner


@dataclass
class EngineCounters:
    base_loads: int = 0
    full_model_loads: int = 0
    model_evictions: int = 0
    adapter_loads: int = 0
    adapter_evictions: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (
            "base_loads", "full_model_loads", "model_evictions", "adapter_loads", "adapter_evictions")}


@dataclass
class LoadedModel:
    key: str
    model: Any  # a base is wrapped in place by `peft` once its first adapter loads
    tokenizer: Any
    device: torch.device
    context_tokens: int
    eos_ids: frozenset[int]
    logits_to_keep: bool  # the model's forward can skip the logits of all but the last position
    peft: Any = None  # the PeftModel around `model`, from the first adapter on
    bank: Any = None  # serve.lora_bank.LoraBank over `peft`: how batches compute with the adapters
    adapters: OrderedDict[str, None] = field(default_factory=OrderedDict)  # least recently used first
    batcher: ModelBatcher | None = None  # runs the model; the only thread that touches it


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def adapter_name(artifact_prefix: str) -> str:
    """The adapter's name inside the PEFT model: PEFT keys modules by it, so no dots or colons."""
    return "ft_" + hashlib.sha256(artifact_prefix.encode()).hexdigest()[:16]


class InferenceEngine:
    def __init__(self, store: ObjectStore, *, cache_dir: Path, device: str = "auto", max_models: int = 1,
                 max_adapters: int = 8, max_batch: int = 16, max_queue: int = 256,
                 max_queue_per_tenant: int | None = None, fair: bool = True) -> None:
        if max_models < 1 or max_adapters < 1 or max_batch < 1 or max_queue < 1:
            raise ValueError("max_models, max_adapters, max_batch and max_queue must be at least 1")
        self.store = store
        self.cache_dir = Path(cache_dir)
        self.device = resolve_device(device)
        self.max_models = max_models
        self.max_adapters = max_adapters
        self.max_batch = max_batch  # sequences decoded together on one model; 1: one request at a time
        self.max_queue = max_queue  # requests waiting per model
        # by default a tenant may fill half the queue: another tenant still finds room
        self.max_queue_per_tenant = max_queue_per_tenant or max(1, max_queue // 2)
        self.fair = fair  # fair admission into each batch (serve/fairness.py); False: plain round-robin
        self.budget = TokenBudget()  # each tenant's tokens of generation in flight on this engine
        self.counters = EngineCounters()
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._models_lock = threading.Lock()
        self._fetch_lock = threading.Lock()
        self._counters_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, store: ObjectStore) -> InferenceEngine:
        return cls(store, cache_dir=layout.local_cache_dir(settings.home), device=settings.inference_device,
                   max_models=settings.inference_max_base_models, max_adapters=settings.inference_max_adapters,
                   max_batch=settings.inference_max_batch, max_queue=settings.inference_max_queue,
                   max_queue_per_tenant=settings.inference_max_queue_per_tenant)

    # -- requests -----------------------------------------------------------------------------------

    def complete(self, target: ModelTarget, prompt: Prompt, params: SamplingParams, *,
                 tenant: str = "") -> Completion:
        return self.submit(target, prompt, params, tenant=tenant).completion()

    def stream(self, target: ModelTarget, prompt: Prompt, params: SamplingParams, *,
               tenant: str = "") -> Iterator[Chunk]:
        """Chunks as they are generated. Loading and prompt checks happen in this call,
        so their errors come before the first chunk; closing the iterator (a client that
        went away) takes the sequence out of its batch."""
        return iter(self.submit(target, prompt, params, tenant=tenant))

    def submit(self, target: ModelTarget, prompt: Prompt, params: SamplingParams, *, tenant: str = "",
               lease: Lease | None = None) -> Sink:
        """Queue a generation on the model's batcher; its chunks arrive in the returned sink
        (iterate it, or `async for` it). Errors of the request itself (prompt, context, a full
        queue: 429) are raised here. Under `lease` the generation holds its tokens until it ends."""
        entry = self._model(target)
        adapter, adapter_dir = self._adapter(target)
        prompt_ids = prompt_token_ids(entry.tokenizer, prompt, target.name)
        if not prompt_ids:
            raise invalid(f"The {prompt.param} is empty", param=prompt.param)
        room = entry.context_tokens - len(prompt_ids)
        if room <= 0:
            raise invalid(f"The {prompt.param} is {len(prompt_ids)} tokens long; {target.name} reads at most "
                          f"{entry.context_tokens} tokens, prompt and completion together",
                          param=prompt.param, code="context_length_exceeded")
        # The completion ends where the context does (finish_reason "length").
        params = replace(params, max_new_tokens=min(params.max_new_tokens, room))
        request = Request(prompt_ids, params, tenant=tenant, adapter=adapter, adapter_dir=adapter_dir,
                          on_end=lease.hold() if lease is not None else None)
        try:
            return self._batcher(entry).submit(request)
        except BaseException:
            request.ended()  # never queued: it holds nothing
            raise

    def logits(self, target: ModelTarget, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits at every position of `token_ids` ([positions, vocabulary],
        float32, on the CPU), from exactly the weights a request on `target` uses."""
        entry = self._model(target)
        adapter, adapter_dir = self._adapter(target)
        batcher = self._batcher(entry)

        def score() -> torch.Tensor:
            if adapter is not None and not self._ensure_adapter(entry, adapter, adapter_dir, set()):
                raise _unavailable("no adapter slot is free on this model")
            ids = torch.tensor([token_ids], dtype=torch.long, device=entry.device)
            with torch.inference_mode():
                output = batcher.run_model([adapter], input_ids=ids)
            return output.logits[0].float().cpu()

        return batcher.call(score)

    def resident(self) -> dict[str, list[str]]:
        """Loaded models (keys, least recently used first) and the adapters on each."""
        with self._models_lock:
            return {key: list(entry.adapters) for key, entry in self._models.items()}

    def load(self) -> dict[str, dict[str, int]]:
        """Per loaded model: sequences running in its batch and requests waiting."""
        with self._models_lock:
            entries = list(self._models.values())
        return {entry.key: entry.batcher.load() for entry in entries if entry.batcher is not None}

    def for_tenant(self, tenant: str, tokens_in_flight: int | None = None) -> TenantEngine:
        """The engine as `tenant` uses it; `tokens_in_flight` bounds its Σ n × max_tokens (None: unbounded)."""
        return TenantEngine(self, tenant, tokens_in_flight)

    def retry_after_s(self, max_tokens: int) -> float:
        """About when a request of `max_tokens` per choice that started now would end: a decoding
        step per token at the recent pace of the loaded models."""
        # Without the lock, which a model load holds for seconds: this runs on the event loop.
        try:
            batchers = [entry.batcher for entry in list(self._models.values()) if entry.batcher is not None]
        except RuntimeError:  # the models changed while copied: the default pace will do
            batchers = []
        step_s = max((batcher.mean_step_s() for batcher in batchers), default=0.05)
        return min(RETRY_AFTER_MAX_S, max(1.0, step_s * max_tokens))

    def _batcher(self, entry: LoadedModel) -> ModelBatcher:
        with self._models_lock:
            if entry.batcher is None:
                entry.batcher = ModelBatcher(
                    entry, max_batch=self.max_batch, max_queue=self.max_queue,
                    max_queue_per_tenant=self.max_queue_per_tenant, fair=self.fair,
                    ensure_adapter=lambda name, adapter_dir, busy: self._ensure_adapter(entry, name, adapter_dir,
                                                                                         busy))
            return entry.batcher

    # -- adapters ---------------------------------------------------------------------------------

    def _ensure_adapter(self, entry: LoadedModel, name: str, adapter_dir: Path | None, busy: set[str]) -> bool:
        """`name` loaded on `entry` (on its batcher's thread), the least recently used adapter
        not in `busy` deleted when that makes one too many. False: every slot is busy."""
        if name in entry.adapters:
            entry.adapters.move_to_end(name)
            return True
        assert adapter_dir is not None
        evictable = [loaded for loaded in entry.adapters if loaded not in busy]
        if len(entry.adapters) >= self.max_adapters and not evictable:
            return False
        started_s = time.perf_counter()
        if entry.peft is None:
            from peft import PeftModel

            entry.peft = PeftModel.from_pretrained(entry.model, str(adapter_dir), adapter_name=name,
                                                   is_trainable=False, torch_device=str(entry.device))
            entry.peft.eval()
            entry.bank = LoraBank(entry.peft)
        else:
            entry.peft.load_adapter(str(adapter_dir), adapter_name=name, is_trainable=False,
                                    torch_device=str(entry.device))
        entry.adapters[name] = None
        entry.bank.changed()
        self._count("adapter_loads")
        log.info("adapter %s loaded on %s in %.3f s", name, entry.key, time.perf_counter() - started_s)
        # Loaded first, deleted second: PEFT keeps a model with no adapter at all badly.
        while len(entry.adapters) > self.max_adapters:
            evicted = next(loaded for loaded in entry.adapters if loaded not in busy and loaded != name)
            del entry.adapters[evicted]
            if entry.peft.active_adapter == evicted:
                entry.peft.set_adapter(name, inference_mode=True)  # PEFT may not delete the active one
            entry.peft.delete_adapter(evicted)
            entry.bank.changed()
            self._count("adapter_evictions")
            log.info("adapter %s evicted from %s", evicted, entry.key)
        if entry.device.type == "cuda":
            torch.cuda.empty_cache()
        return True

    def _adapter(self, target: ModelTarget) -> tuple[str | None, Path | None]:
        """The adapter a request on `target` runs with (its name in the PEFT model and its local
        files), or (None, None) for the base alone and full fine-tunes."""
        if target.is_base or target.artifact_kind == FULL_MODEL:
            return None, None
        prefix = str(target.artifact_prefix)
        return adapter_name(prefix), self._artifact_dir(prefix)

    def _artifact_dir(self, prefix: str) -> Path:
        """A local copy of the artifact under `prefix`, downloaded once: artifacts are
        immutable once registered, so the prefix names the content."""
        target = layout.artifact_cache_dir(self.cache_dir, prefix)
        if (target / _COMPLETE_MARKER).exists():
            return target
        with self._fetch_lock:
            if (target / _COMPLETE_MARKER).exists():
                return target
            staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            if not self.store.download_prefix(prefix, staging):
                shutil.rmtree(staging, ignore_errors=True)
                raise _unavailable(f"the files of this model are missing from the object store ({prefix})")
            (staging / _COMPLETE_MARKER).write_text(prefix)
            shutil.rmtree(target, ignore_errors=True)  # a copy that an earlier crash left unfinished
            staging.rename(target)
        return target

    # -- loaded models ------------------------------------------------------------------------------

    def _model(self, target: ModelTarget) -> LoadedModel:
        full = target.artifact_kind == FULL_MODEL and not target.is_base
        key = f"model:{target.artifact_prefix}" if full else f"base:{target.base.sha256}"
        # Held while loading: a second request for the same model waits instead of loading it again.
        with self._models_lock:
            entry = self._models.get(key)
            if entry is not None:
                self._models.move_to_end(key)
                return entry
            # Evicted before the load, so memory never holds one model too many; a
            # request still running on an evicted model keeps it alive until it ends.
            while len(self._models) >= self.max_models:
                evicted_key, _ = self._models.popitem(last=False)
                self._count("model_evictions")
                log.info("model %s evicted", evicted_key)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            entry = self._load_full(key, target) if full else self._load_base(key, target)
            self._models[key] = entry
            return entry

    def _load_base(self, key: str, target: ModelTarget) -> LoadedModel:
        try:
            local_dir = fetch_base_model(self.store, target.base, layout.base_model_cache_dir(self.cache_dir))
        except FileNotFoundError as exc:
            raise _unavailable(f"the files of base model {target.base.name} are missing from the object "
                               "store") from exc
        entry = self._load(key, local_dir)
        self._count("base_loads")
        return entry

    def _load_full(self, key: str, target: ModelTarget) -> LoadedModel:
        entry = self._load(key, self._artifact_dir(str(target.artifact_prefix)))
        self._count("full_model_loads")
        return entry

    def _load(self, key: str, local_dir: Path) -> LoadedModel:
        started_s = time.perf_counter()
        model, tokenizer = load_base_model(local_dir, self.device)
        model.eval()
        log.info("%s loaded on %s in %.2f s", key, self.device, time.perf_counter() - started_s)
        return LoadedModel(key=key, model=model, tokenizer=tokenizer, device=self.device,
                           context_tokens=context_tokens(model, tokenizer), eos_ids=eos_ids(model, tokenizer),
                           logits_to_keep="logits_to_keep" in inspect.signature(model.forward).parameters)

    # -- counters -------------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._counters_lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    def stats(self) -> dict[str, Any]:
        with self._counters_lock:
            values = self.counters.snapshot()
        with self._models_lock:
            batchers = [entry.batcher for entry in self._models.values() if entry.batcher is not None]
        for name in ("prefills", "decode_steps", "decoded_rows", "queue_full", "preemptions"):
            values[name] = sum(getattr(batcher.counters, name) for batcher in batchers)
        values["largest_batch"] = max((batcher.counters.largest_batch for batcher in batchers), default=0)
        return values


def _unavailable(message: str) -> ApiError:
    # Not the caller's mistake, and not a crash: the platform lost files it should hold.
    return ApiError(503, message, type="server_error", param="model", code="model_unavailable")


@dataclass(frozen=True)
class TenantEngine:
    """The engine as one tenant's requests use it: their place in the batchers' round-robin and
    their bound on tokens in flight. A request of several choices reserves them all first
    (`reserve`) and submits them `under` that lease; a lone submit reserves its own."""

    engine: InferenceEngine
    tenant: str
    tokens_in_flight: int | None = None  # the bound on Σ n × max_tokens; None: unbounded
    lease: Lease | None = None

    def reserve(self, max_tokens: int, choices: int = 1, *, param: str = "max_tokens") -> Lease:
        """`choices × max_tokens` of the tenant's budget, all or none (429 when its other requests
        hold too much, 400 when it never could fit). `with` it around the submissions."""
        return self.engine.budget.reserve(self.tenant, choices * max_tokens, self.tokens_in_flight,
                                          retry_after_s=self.engine.retry_after_s(max_tokens), param=param)

    def under(self, lease: Lease) -> TenantEngine:
        """This engine submitting under `lease` (reserved by `reserve`)."""
        return replace(self, lease=lease)

    def complete(self, target: ModelTarget, prompt: Prompt, params: SamplingParams) -> Completion:
        return self.submit(target, prompt, params).completion()

    def stream(self, target: ModelTarget, prompt: Prompt, params: SamplingParams) -> Iterator[Chunk]:
        return iter(self.submit(target, prompt, params))

    def submit(self, target: ModelTarget, prompt: Prompt, params: SamplingParams) -> Sink:
        if self.lease is not None:
            return self.engine.submit(target, prompt, params, tenant=self.tenant, lease=self.lease)
        with self.reserve(params.max_new_tokens) as lease:
            return self.engine.submit(target, prompt, params, tenant=self.tenant, lease=lease)

    async def acomplete(self, target: ModelTarget, prompt: Prompt, params: SamplingParams) -> Completion:
        """The whole answer, awaited: queuing (which may load the model) runs on a worker thread,
        the wait for the answer holds none."""
        import anyio

        sink = await anyio.to_thread.run_sync(self.submit, target, prompt, params)
        return await sink.acompletion()


def context_tokens(model: Any, tokenizer: Any) -> int:
    """Positions the model reads: its config's limit, else the tokenizer's, else 2048."""
    config = model.config
    for attribute in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    # Tokenizers without a limit report a huge sentinel (int(1e30)).
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else 2048


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a generation: the generation config's (an int or a list) and the tokenizer's."""
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, (list, tuple)):
        ids.update(int(value) for value in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
