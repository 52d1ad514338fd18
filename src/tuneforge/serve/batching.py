"""Continuous batching: every request on one loaded model decodes in the same forward pass.

A `ModelBatcher` owns one loaded model (a base with its adapters, or a full
fine-tune) and a thread that runs it. Between two decoding steps it admits
waiting requests: the new prompts are prefilled together in one forward pass
(left-padded to the longest) and their caches join the batch's. A step then feeds every running sequence's last
token at once, each at its own position, and each sequence's `SequenceDecoder`
picks its next token from its row of the logits with its own sampling
parameters and random generator. Finished or cancelled sequences leave the
batch after the step.

The batch's KV cache is one tensor per layer, the sequences left-padded to the
longest; an attention mask hides the padding and explicit position ids give
each sequence its own positions, so a sequence computes what it computes
alone (the tests compare logits). Columns that only padding uses are cut once
the sequence that needed them has left.

Adapters of one base share a batch: PEFT's mixed-adapter forward
(`adapter_names`, one per row, "__base__" for the base alone) applies each
row's own LoRA weights. An adapter that a running sequence uses is never
evicted; a request whose adapter has no free slot waits for one.

Waiting requests queue per tenant. A free row goes to the waiting tenant
holding the fewest rows (round-robin among equals), and when the batch is
full a tenant over its fair share of the rows has rows set aside for the
waiting ones, those with the least to recompute (serve/fairness.py). A
set-aside row keeps its decoder and tokens, waits at the head of its
tenant's queue, and resumes by prefilling its prompt and the tokens it had
fed (recompute preemption, as vLLM's). Nothing running is killed; one tenant's burst delays another's first
token by a step, not by a whole generation. The queue is bounded (in total
and per tenant): beyond it, 429 with Retry-After.

The thread ends after `idle_s` without work and starts again with the next
request.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tuneforge.domain.errors import ApiError, rate_limited
from tuneforge.serve.fairness import next_tenant, rows_to_preempt
from tuneforge.serve.generation import SequenceDecoder
from tuneforge.serve.params import Chunk, SamplingParams
from tuneforge.serve.sinks import Sink

log = logging.getLogger(__name__)

BASE_ROW = "__base__"  # PEFT's name for a row that runs the base model alone
PREFILL_TOKENS = 8192  # padded prompt tokens prefilled in one forward pass, at most (a longer prompt goes alone)


@dataclass(eq=False)
class Resume:
    """A row set aside for another tenant's (see the module's docstring): what it needs to go on."""

    decoder: SequenceDecoder
    generated: list[int]  # tokens fed to the model after the prompt: its cache held prompt + these
    last_token: int  # picked, not fed yet


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    tenant: str
    adapter: str | None = None  # the PEFT adapter's name; None: the model's own weights
    adapter_dir: Path | None = None
    sink: Sink = field(default_factory=Sink)
    queued_s: float = field(default_factory=time.monotonic)
    on_end: Callable[[], None] | None = None  # told once when the request leaves (serve/budget.py's lease)
    resume: Resume | None = None  # a set-aside row waiting to go on

    @property
    def input_ids(self) -> list[int]:
        """What its prefill feeds: the prompt, and for a set-aside row the tokens it had fed since."""
        return self.prompt_ids if self.resume is None else self.prompt_ids + self.resume.generated

    def ended(self) -> None:
        """The request has left for good (finished, cancelled or failed); the first call counts."""
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()


@dataclass(eq=False)
class _Row:
    request: Request
    decoder: SequenceDecoder
    last_token: int
    position: int  # of the next token: the tokens the sequence holds in the cache
    generated: list[int] = field(default_factory=list)  # fed after the prompt (to resume it if set aside)


@dataclass
class BatchCounters:
    prefills: int = 0
    decode_steps: int = 0
    decoded_rows: int = 0  # sequences over all steps: / decode_steps = the mean batch size
    largest_batch: int = 0
    queue_full: int = 0
    preemptions: int = 0  # rows set aside for another tenant's (and resumed later)


class ModelBatcher:
    """The decoding loop of one loaded model (see the module's docstring).

    `ensure_adapter(name, adapter_dir, busy)` loads an adapter onto the model if needed,
    never evicting one in `busy`, and returns False when every slot is busy. It runs on the
    batcher's thread, the only one that touches the model.

    `fair=False` admits waiting tenants in plain round-robin and never sets a row aside (the
    behaviour before fair admission; benchmarks/inference_fairness.py compares the two)."""

    def __init__(self, entry: Any, *, max_batch: int, max_queue: int, max_queue_per_tenant: int,
                 ensure_adapter: Callable[[str, Path, set[str]], bool], idle_s: float = 30.0,
                 fair: bool = True) -> None:
        self.entry = entry
        self.max_batch = max(1, max_batch)
        self.fair = fair
        self.max_queue = max_queue
        self.max_queue_per_tenant = max_queue_per_tenant
        self.idle_s = idle_s
        self.counters = BatchCounters()
        self._ensure_adapter = ensure_adapter
        self._work = threading.Condition()
        self._waiting: OrderedDict[str, deque[Request]] = OrderedDict()  # tenant -> requests, round-robin
        self._queued = 0
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._thread: threading.Thread | None = None
        self._rows: list[_Row] = []
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # the batch's KV cache
        self._mask: torch.Tensor | None = None  # [rows, cached positions]: 1 where a token is
        self._padded = False  # some row of the cache is padding
        self._step_s: deque[float] = deque(maxlen=64)  # recent step times, for Retry-After
        # transformers renamed `past_key_values` to `cache` (5.2 knows only the old name)
        parameters = inspect.signature(entry.model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    # -- callers ----------------------------------------------------------------------------------

    def submit(self, request: Request) -> Sink:
        with self._work:
            waiting = self._waiting.get(request.tenant)
            if self._queued >= self.max_queue or (waiting is not None and len(waiting) >= self.max_queue_per_tenant):
                self.counters.queue_full += 1
                raise rate_limited("This model has too many requests waiting; retry shortly.",
                                   code="engine_overloaded", retry_after=self._retry_after_s())
            self._waiting.setdefault(request.tenant, deque()).append(request)
            self._queued += 1
            self._wake()
        return request.sink

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the batcher's thread between two steps (it may use the model) and return
        its result."""
        future: Future = Future()
        with self._work:
            self._calls.append((fn, future))
            self._wake()
        return future.result()

    def load(self) -> dict[str, int]:
        with self._work:
            return {"running": len(self._rows), "waiting": self._queued}

    def _wake(self) -> None:
        # the caller holds self._work
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"tuneforge-batch-{self.entry.key[:24]}",
                                            daemon=True)
            self._thread.start()
        self._work.notify()

    def mean_step_s(self) -> float:
        """The recent mean time of a step (a prefill or a decoding step), 50 ms before any."""
        steps = list(self._step_s)  # copied at once: the batcher's thread appends meanwhile
        return sum(steps) / len(steps) if steps else 0.05

    def _retry_after_s(self) -> float:
        # about the time the requests ahead need to start: a step per queued request, at least a second
        return max(1.0, self.mean_step_s() * max(1, self._queued) / self.max_batch * 8)

    # -- the loop ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._work:
                while not (self._rows or self._queued or self._calls):
                    if not self._work.wait(self.idle_s) and not (self._rows or self._queued or self._calls):
                        self._thread = None
                        return
                calls = list(self._calls)
                self._calls.clear()
            for fn, future in calls:
                self._run_call(fn, future)
            try:
                self._admit()
                if self._rows:
                    self._step()
            except Exception as exc:  # noqa: BLE001 - the batch is lost, not the server: every member is told
                log.exception("batched generation failed on %s", self.entry.key)
                self._fail_all(exc)

    def _run_call(self, fn: Callable[[], Any], future: Future) -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)

    def _next_waiting(self, held_rows: Counter[str]) -> Request | None:
        # the caller holds self._work; the chosen tenant gives one request and goes to the back
        while self._waiting:
            tenant = next_tenant(self._waiting, held_rows if self.fair else {})
            assert tenant is not None
            requests = self._waiting[tenant]
            request = requests.popleft()
            self._queued -= 1
            if requests:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            if not request.sink.cancelled.is_set():
                return request
            self._finish(request)
        return None

    def _put_back(self, request: Request) -> None:
        with self._work:
            self._waiting.setdefault(request.tenant, deque()).appendleft(request)
            self._waiting.move_to_end(request.tenant, last=False)
            self._queued += 1

    def _admit(self) -> None:
        """Waiting requests join, as many as the batch has room for (after setting aside the rows
        of a tenant over its share, when others wait) and at most `PREFILL_TOKENS` padded prompt
        tokens at once, prefilled together."""
        if self.fair:
            self._preempt()
        ready: list[Request] = []
        held_rows = Counter(row.request.tenant for row in self._rows)
        while len(self._rows) + len(ready) < self.max_batch:
            with self._work:
                request = self._next_waiting(held_rows)
            if request is None:
                break
            width = max([len(request.input_ids), *(len(r.input_ids) for r in ready)])
            if ready and width * (len(ready) + 1) > PREFILL_TOKENS:
                self._put_back(request)  # it starts with the next step's admissions
                break
            if request.adapter is not None:
                busy = {row.request.adapter for row in self._rows if row.request.adapter is not None}
                busy |= {r.adapter for r in ready if r.adapter is not None}
                try:
                    loaded = self._ensure_adapter(request.adapter, request.adapter_dir, busy)
                except Exception as exc:  # noqa: BLE001 - this request's adapter, not the batch
                    self._finish(request, exc)
                    continue
                if not loaded:  # every adapter slot is in use: wait for a sequence to finish
                    self._put_back(request)
                    break
            ready.append(request)
            held_rows[request.tenant] += 1
        if not ready:
            return
        try:
            self._prefill(ready)
        except Exception as exc:  # noqa: BLE001 - these requests fail; the running batch goes on
            failure = exc if isinstance(exc, ApiError) else _internal(exc)
            if not isinstance(exc, ApiError):
                log.exception("prefill failed on %s", self.entry.key)
            for request in ready:
                self._finish(request, failure)

    def _preempt(self) -> None:
        """Rows of a tenant over its fair share set aside for the tenants waiting within theirs
        (serve/fairness.py); each waits at the head of its tenant's queue to resume."""
        if not self._rows:
            return
        with self._work:
            waiting = {tenant: len(requests) for tenant, requests in self._waiting.items()}
        plan = rows_to_preempt(Counter(row.request.tenant for row in self._rows), waiting, self.max_batch)
        if not plan:
            return
        leaving: set[int] = set()
        for tenant, count in plan.items():
            theirs = [index for index, row in enumerate(self._rows) if row.request.tenant == tenant]
            # the least work to redo first: the fewest tokens to prefill again, the newest among equals
            theirs.sort(key=lambda index: (self._rows[index].position, -index))
            leaving.update(theirs[:count])
        set_aside = [row for index, row in enumerate(self._rows) if index in leaving]
        self._keep([index for index in range(len(self._rows)) if index not in leaving])
        with self._work:
            for row in reversed(set_aside):  # appended to the left: they keep their order
                row.request.resume = Resume(row.decoder, row.generated, row.last_token)
                self._waiting.setdefault(row.request.tenant, deque()).appendleft(row.request)
                self._queued += 1
        self.counters.preemptions += len(set_aside)
        log.debug("%d rows set aside on %s: %s", len(set_aside), self.entry.key, plan)

    # -- the model ---------------------------------------------------------------------------------

    def _forward(self, requests: list[Request], cache: Any, **inputs: Any) -> Any:
        entry = self.entry
        extra = {"logits_to_keep": 1} if entry.logits_to_keep else {}
        inputs[self._cache_arg] = cache
        return self.run_model([request.adapter for request in requests], use_cache=True, **inputs, **extra)

    def run_model(self, adapters: list[str | None], **inputs: Any) -> Any:
        """One forward pass, row i through adapter `adapters[i]` (None: the base alone). On the
        batcher's thread only."""
        entry = self.entry
        if entry.peft is None:
            return entry.model(**inputs)
        bank = entry.bank
        if bank is not None and bank.prepare(list(entry.adapters)):  # the stacked adapters (serve/lora_bank.py)
            bank.activate(adapters, entry.device)
            try:
                return entry.peft(**inputs)
            finally:
                bank.clear()
        names = set(adapters)
        if len(names) > 1 or None in names:
            # PEFT's mixed-adapter forward: each row through its own adapter, or none ("__base__";
            # cheaper per step than entering and leaving disable_adapter())
            return entry.peft(**inputs, adapter_names=[name or BASE_ROW for name in adapters])
        (name,) = names
        if entry.peft.active_adapter != name:
            entry.peft.set_adapter(name, inference_mode=True)
        return entry.peft(**inputs)

    def _prefill(self, requests: list[Request]) -> None:
        """The prompts in one forward pass (left-padded to the longest), each one's first token
        picked; those that go on join the batch."""
        from transformers.cache_utils import DynamicCache

        started_s = time.perf_counter()
        entry, device = self.entry, self.entry.device
        inputs_ids = [request.input_ids for request in requests]
        lengths = [len(input_ids) for input_ids in inputs_ids]
        width = max(lengths)
        ids = torch.zeros(len(requests), width, dtype=torch.long, device=device)
        mask = torch.zeros(len(requests), width, dtype=torch.long, device=device)
        for row, input_ids in enumerate(inputs_ids):
            ids[row, width - lengths[row]:] = torch.tensor(input_ids, dtype=torch.long, device=device)
            mask[row, width - lengths[row]:] = 1
        padded = min(lengths) < width
        inputs: dict[str, Any] = {"input_ids": ids}
        if padded:  # without padding the model takes its plain causal path
            inputs |= {"attention_mask": mask, "position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0)}
        with torch.inference_mode():
            output = self._forward(requests, DynamicCache(), **inputs)
        self.counters.prefills += len(requests)
        going_on: list[int] = []
        for row, request in enumerate(requests):
            if request.resume is not None:  # a set-aside row: its next token was picked before it left
                resume, request.resume = request.resume, None
                going_on.append(row)
                self._rows.append(_Row(request, resume.decoder, resume.last_token, lengths[row], resume.generated))
                continue
            decoder = SequenceDecoder(entry.tokenizer, request.prompt_ids, request.params, eos_ids=entry.eos_ids,
                                      device=device)
            token, chunks = decoder.step(output.logits[row, -1])
            self._deliver(request, chunks)
            if decoder.done or token is None:
                self._finish(request)
                continue
            going_on.append(row)
            self._rows.append(_Row(request, decoder, token, lengths[row]))
        if going_on:
            self._join(*_select_rows(_layer_tensors(output), mask, going_on))
        self._step_s.append(time.perf_counter() - started_s)

    def _join(self, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        """Prefilled sequences' caches (rows of `mask`, 1 where a token is) become the batch's last rows."""
        if self._layers is None:
            self._layers, self._mask = layers, mask
        else:
            assert self._mask is not None
            width = max(self._mask.shape[1], mask.shape[1])
            self._layers = [(torch.cat([_left_pad(keys, width), _left_pad(new_keys, width)]),
                             torch.cat([_left_pad(values, width), _left_pad(new_values, width)]))
                            for (keys, values), (new_keys, new_values) in zip(self._layers, layers)]
            self._mask = torch.cat([torch.nn.functional.pad(self._mask, (width - self._mask.shape[1], 0)),
                                    torch.nn.functional.pad(mask, (width - mask.shape[1], 0))])
        self._padded = not bool(self._mask.all())

    def _step(self) -> None:
        from transformers.cache_utils import DynamicCache

        started_s = time.perf_counter()
        rows, device = self._rows, self.entry.device
        assert self._layers is not None and self._mask is not None
        mask = torch.cat([self._mask, torch.ones(len(rows), 1, dtype=torch.long, device=device)], dim=1)
        with torch.inference_mode():
            output = self._forward(
                [row.request for row in rows],
                DynamicCache(ddp_cache_data=self._layers),
                input_ids=torch.tensor([[row.last_token] for row in rows], dtype=torch.long, device=device),
                # without padding the mask says nothing: the model takes its plain causal path
                attention_mask=mask if self._padded else None,
                position_ids=torch.tensor([[row.position] for row in rows], dtype=torch.long, device=device),
            )
        self._layers, self._mask = _layer_tensors(output), mask
        self.counters.decode_steps += 1
        self.counters.decoded_rows += len(rows)
        self.counters.largest_batch = max(self.counters.largest_batch, len(rows))
        keep: list[int] = []
        for index, row in enumerate(rows):
            row.generated.append(row.last_token)  # fed at this step: in the cache now
            if row.request.sink.cancelled.is_set():
                self._finish(row.request)
                continue
            token, chunks = row.decoder.step(output.logits[index, -1])
            self._deliver(row.request, chunks)
            if row.decoder.done or token is None:
                self._finish(row.request)
                continue
            row.last_token, row.position = token, row.position + 1
            keep.append(index)
        if len(keep) < len(rows):
            self._keep(keep)
        self._step_s.append(time.perf_counter() - started_s)

    def _keep(self, keep: list[int]) -> None:
        """Only the rows `keep` go on; padding that only the others needed is cut."""
        self._rows = [self._rows[index] for index in keep]
        if not self._rows:
            self._layers = self._mask = None
            return
        assert self._layers is not None and self._mask is not None
        self._layers, self._mask = _select_rows(self._layers, self._mask, keep)
        self._padded = not bool(self._mask.all())

    def _deliver(self, request: Request, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            request.sink.put(chunk)

    def _finish(self, request: Request, failure: BaseException | None = None) -> None:
        """`request` leaves for good: its reader gets the end (or `failure`), its lease is let go."""
        if failure is None:
            request.sink.end()
        else:
            request.sink.put(failure)
        request.ended()

    def _fail_all(self, exc: Exception) -> None:
        for row in self._rows:
            self._finish(row.request, _internal(exc))
        self._rows, self._layers, self._mask = [], None, None


def _internal(cause: Exception) -> ApiError:
    failure = ApiError(500, "The server had an error while generating.", type="server_error", code="internal_error")
    failure.__cause__ = cause
    return failure


def _layer_tensors(output: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values of every layer of a forward pass's cache."""
    cache = output.cache if getattr(output, "cache", None) is not None else output.past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def _select_rows(layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, rows: list[int]
                 ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The cache and mask of `rows` only, without the leading columns that only the other rows used."""
    index = torch.tensor(rows, dtype=torch.long, device=mask.device)
    kept = mask[index]
    unused = int((kept.sum(dim=0) == 0).long().cumprod(dim=0).sum())
    return [(keys[index][:, :, unused:], values[index][:, :, unused:]) for keys, values in layers], kept[:, unused:]


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[batch, heads, positions, dim] padded with zeros on the left to `width` positions."""
    missing = width - tensor.shape[2]
    if missing == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, missing, 0))
