"""Co-training: one frozen base in memory, many LoRA models (of any rank, of any tenant) trained
through it together.

`SharedBase` holds the base once and hosts adapters by name. A forward hook on every linear layer
an adapter may adapt adds, for each contiguous run of rows of the batch, that run's own adapter:

    y[s:e] = base(x)[s:e] + ((x[s:e] @ A^T) @ B^T) * alpha / rank

so a batch mixing rows of many models is one pass through the base, and one backward pass over
the sum of every request's loss leaves in each adapter's gradient exactly the gradient of its own
requests' loss: the losses are sums (never means over the batch), a row's activations depend only
on its own adapter, and the base is frozen. Padding is on the right under an attention mask, so a
row's positions see only its own tokens. The only difference from training a model alone is the
order of floating-point additions inside batched matrix products.

Gradients accumulate over `forward_backward` calls until the model's `optim_step` (AdamW, the
model's own optimizer and hyperparameters, optional gradient-norm clipping), which clears them.
A model's state (`state_bytes`) is its adapter and its optimizer; loading it back and taking the
same steps gives the same numbers, bit for bit on the same device and batch composition.

Loss functions (token-level sums, no normalisation; lp = the model's log-probability of a target):
  cross_entropy        -sum(lp * weights)                weights any real number
  importance_sampling  -sum(exp(lp - logprobs) * advantages)
  ppo                  -sum(min(r * A, clamp(r, lo, hi) * A)),  r = exp(lp - logprobs)
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

LORA_ALPHA = 32.0
LOSS_FUNCTIONS = ("cross_entropy", "importance_sampling", "ppo")
LOSS_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
}
MAX_RANK = 128
MAX_SAMPLE_BATCH_TOKENS = 1 << 20  # the rows x positions one sample request may hold in its key/value cache
DENSE_RANKS = 512  # the ranks of a pass's adapters together at most this: one product for all (`_dense_delta`)
_ATTENTION_WORDS = ("attn", "attention")
_MLP_WORDS = ("mlp", "feed_forward", "ffn")


class RequestError(Exception):
    """One request cannot run as given: its own failure (`category` user), never its cycle's."""

    def __init__(self, message: str, category: str = "user") -> None:
        super().__init__(message)
        self.message = message
        self.category = category


@dataclass(frozen=True)
class LoraShape:
    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None
    alpha: float = LORA_ALPHA  # the product is scaled by alpha / rank (an ordinary job's own alpha on the pool)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "train_attn": self.train_attn, "train_mlp": self.train_mlp,
                "train_unembed": self.train_unembed, "seed": self.seed, "alpha": self.alpha}


@dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class Datum:
    tokens: list[int]
    inputs: dict[str, torch.Tensor]  # by key: target_tokens (int64), weights / logprobs / advantages (float32)


@dataclass
class ForwardBackward:
    model: str
    data: list[Datum]
    loss_fn: str = "cross_entropy"
    config: dict[str, float] = field(default_factory=dict)
    forward_only: bool = False

    def tokens(self) -> int:
        return sum(len(datum.tokens) for datum in self.data)


@dataclass
class ForwardBackwardResult:
    logprobs: list[torch.Tensor]  # per datum, the shape of its target_tokens
    elementwise_loss: list[torch.Tensor]
    metrics: dict[str, float]


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # ended by a stop token or string (else by max_tokens)


@dataclass
class SampleRequest:
    model: str | None  # None: the base alone
    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    stop: list[str] | list[int] | None = None
    seed: int | None = None
    prompt_logprobs: bool = False


@dataclass
class SampleResult:
    sequences: list[Sampled]
    prompt_logprobs: list[float] | None  # len(prompt), NaN at 0


class Adapter:
    """One hosted LoRA model: A [rank, in] and B [out, rank] per adapted layer, and its AdamW."""

    def __init__(self, shape: LoraShape, layers: list[tuple[str, torch.nn.Linear]]) -> None:
        self.shape = shape
        self.scaling = shape.alpha / shape.rank
        generator = torch.Generator().manual_seed(shape.seed if shape.seed is not None else 0)
        self.weights: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
        for path, linear in layers:  # A as PEFT starts it (Kaiming uniform), B zero: the base at step 0
            weight = linear.weight
            a = torch.empty(shape.rank, linear.in_features, dtype=torch.float32)
            torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
            b = torch.zeros(linear.out_features, shape.rank, dtype=torch.float32)
            self.weights[path] = (torch.nn.Parameter(a.to(weight.device)), torch.nn.Parameter(b.to(weight.device)))
        self.optimizer: torch.optim.AdamW | None = None
        self.steps = 0

    def parameters(self) -> list[torch.nn.Parameter]:
        return [param for pair in self.weights.values() for param in pair]

    def delta(self, path: str, x: torch.Tensor) -> torch.Tensor | None:
        pair = self.weights.get(path)
        if pair is None:
            return None
        a, b = pair
        return ((x.to(a.dtype) @ a.T) @ b.T) * self.scaling

    def step(self, params: AdamParams) -> dict[str, float]:
        parameters = self.parameters()
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(parameters, lr=params.learning_rate)
        for group in self.optimizer.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                         weight_decay=params.weight_decay)
        grads = [param.grad for param in parameters if param.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        if params.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(parameters, params.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}

    def peft_weights(self) -> dict[str, torch.Tensor]:
        """The adapter under PEFT's names, to load with `PeftModel.from_pretrained` on the base."""
        out: dict[str, torch.Tensor] = {}
        for path, (a, b) in self.weights.items():
            out[f"base_model.model.{path}.lora_A.weight"] = a.detach().cpu().contiguous()
            out[f"base_model.model.{path}.lora_B.weight"] = b.detach().cpu().contiguous()
        return out

    def peft_config(self, base_model: str) -> dict[str, Any]:
        targets = sorted({path.rsplit(".", 1)[-1] for path in self.weights})
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.shape.rank, "lora_alpha": self.shape.alpha,
                "lora_dropout": 0.0, "bias": "none", "target_modules": targets,
                "base_model_name_or_path": base_model, "inference_mode": True}

    def state_bytes(self, with_optimizer: bool = True, with_gradients: bool = False) -> bytes:
        """Adapter weights, shape, step count and (optionally) the optimizer: exact resume. With the
        gradients accumulated since the last step too when a worker lets the model go between a
        forward_backward and its optim_step (idle release, preemption)."""
        grads = None
        if with_gradients:
            grads = {path: tuple(None if p.grad is None else p.grad.detach().cpu() for p in pair)
                     for path, pair in self.weights.items()}
        state = {"shape": self.shape.to_json(), "steps": self.steps, "gradients": grads,
                 "weights": {path: (a.detach().cpu(), b.detach().cpu()) for path, (a, b) in self.weights.items()},
                 "optimizer": self.optimizer.state_dict() if with_optimizer and self.optimizer is not None else None}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()


def read_state(data: bytes) -> dict[str, Any]:
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "shape" not in state or "weights" not in state:
        raise RequestError("the checkpoint is not a training state")
    return state


def shape_of_state(state: dict[str, Any]) -> LoraShape:
    return LoraShape(**state["shape"])


class SharedBase:
    """The base model once; adapters hosted by name; batched passes over rows of many adapters."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, *, max_pass_tokens: int = 16384) -> None:
        model.requires_grad_(False)
        self.max_pass_tokens = max_pass_tokens  # rows x padded width of one pass through the base
        model.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.adapters: dict[str, Adapter] = {}
        self._runs: list[tuple[int, int, Adapter | None]] | None = None
        self._masks: dict[tuple, torch.Tensor] = {}  # the dense path's row masks, per layout of a pass
        self._kinds: dict[str, str] = {}
        unembed = model.get_output_embeddings()
        for path, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            kind = _kind(path, module is unembed)
            if kind is None:
                continue
            self._kinds[path] = kind
            module.register_forward_hook(self._hook(path))

    # hosting ---------------------------------------------------------------------------------------
    def host(self, name: str, shape: LoraShape) -> Adapter:
        if not 1 <= shape.rank <= MAX_RANK:
            raise RequestError(f"lora_config.rank must be between 1 and {MAX_RANK}")
        wanted = {"attn": shape.train_attn, "mlp": shape.train_mlp, "unembed": shape.train_unembed}
        layers = [(path, module) for path, module in self.model.named_modules()
                  if path in self._kinds and wanted[self._kinds[path]]]
        if not layers:
            raise RequestError("lora_config trains no layer: set one of train_attn, train_mlp, train_unembed")
        adapter = Adapter(shape, layers)
        self.adapters[name] = adapter
        return adapter

    def drop(self, name: str) -> None:
        self.adapters.pop(name, None)

    def load_state(self, name: str, data: bytes, *, with_optimizer: bool) -> Adapter:
        state = read_state(data)
        adapter = self.host(name, shape_of_state(state))
        if set(state["weights"]) != set(adapter.weights):
            raise RequestError("the checkpoint's adapter does not fit this base model")
        with torch.no_grad():
            for path, (a, b) in state["weights"].items():
                own_a, own_b = adapter.weights[path]
                if own_a.shape != a.shape or own_b.shape != b.shape:
                    raise RequestError("the checkpoint's adapter does not fit this base model")
                own_a.copy_(a)
                own_b.copy_(b)
        adapter.steps = int(state.get("steps", 0))
        for path, grads in (state.get("gradients") or {}).items():
            for param, grad in zip(adapter.weights[path], grads):
                param.grad = None if grad is None else grad.to(param.device).clone()
        if with_optimizer and state.get("optimizer") is not None:
            adapter.optimizer = torch.optim.AdamW(adapter.parameters())
            adapter.optimizer.load_state_dict(state["optimizer"])
        return adapter

    # the adapters' hook --------------------------------------------------------------------------------
    def _hook(self, path: str) -> Any:
        def add(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            runs = self._runs
            if not runs:
                return output
            x = inputs[0]
            present = [(start, end, adapter, adapter.weights[path]) for start, end, adapter in runs
                       if adapter is not None and path in adapter.weights]
            if not present:
                return output
            if len(runs) == 1:
                delta = runs[0][2].delta(path, x)  # type: ignore[union-attr]
            elif sum(pair[0].shape[0] for *_run, pair in present) <= DENSE_RANKS:
                delta = self._dense_delta(x, present)
            else:
                delta = self._split_delta(path, x, runs, output)
            return output + delta.to(output.dtype)
        return add

    def _dense_delta(self, x: torch.Tensor, present: list[tuple[int, int, Adapter, tuple]]) -> torch.Tensor:
        """Few adapters of small rank: every run's A side by side (one product for all rows), each row
        keeping only its own adapter's columns (a mask of ones and zeros: the other adapters get an
        exactly zero gradient from it), then every B side by side. A handful of operations per layer
        whatever the number of models, where a run at a time would cost a few per model."""
        a = torch.cat([pair[0] for *_run, pair in present])  # [ranks of all, in]
        b = torch.cat([pair[1] * adapter.scaling for _start, _end, adapter, pair in present], dim=1)  # [out, ranks]
        key = tuple((start, end, pair[0].shape[0]) for start, end, _adapter, pair in present)
        mask = self._masks.get(key)
        if mask is None:
            mask = torch.zeros(x.shape[0], a.shape[0], dtype=a.dtype, device=a.device)
            column = 0
            for start, end, rank in key:
                mask[start:end, column:column + rank] = 1
                column += rank
            self._masks[key] = mask
        hidden = (x.to(a.dtype) @ a.T) * mask.view(x.shape[0], *([1] * (x.dim() - 2)), a.shape[0])
        return hidden @ b.T

    @staticmethod
    def _split_delta(path: str, x: torch.Tensor, runs: list[tuple[int, int, Adapter | None]],
                     output: torch.Tensor) -> torch.Tensor:
        """Many adapters or large ranks: each run's own product. One split of the input, not a slice per
        run: a slice's backward writes a gradient the size of the whole input, so slices would cost runs
        x rows; a split's backward is one concatenation."""
        parts = x.split([end - start for start, end, _adapter in runs])
        pieces = []
        for (start, end, adapter), part in zip(runs, parts):
            delta = adapter.delta(path, part) if adapter is not None else None
            pieces.append(output.new_zeros((end - start, *output.shape[1:])) if delta is None else delta)
        return torch.cat([piece.to(output.dtype) for piece in pieces])

    @contextlib.contextmanager
    def _with_runs(self, runs: list[tuple[int, int, Adapter | None]]) -> Iterator[None]:
        self._runs = runs
        self._masks = {}
        try:
            yield
        finally:
            self._runs = None
            self._masks = {}

    # forward / backward -------------------------------------------------------------------------------
    def check(self, request: ForwardBackward) -> None:
        """Every way a request can be wrong, found before it joins a batch."""
        if request.model not in self.adapters:
            raise RequestError(f"model {request.model} is not hosted")
        if request.loss_fn not in LOSS_FUNCTIONS:
            raise RequestError(f"loss_fn {request.loss_fn!r} is not supported here; use one of "
                               f"{', '.join(LOSS_FUNCTIONS)}")
        if not request.data:
            raise RequestError("data is empty")
        for index, datum in enumerate(request.data):
            where = f"data[{index}]"
            if not datum.tokens:
                raise RequestError(f"{where}.model_input is empty")
            if self.context is not None and len(datum.tokens) > self.context:
                raise RequestError(f"{where}.model_input has {len(datum.tokens)} tokens, more than the base's "
                                   f"context of {self.context}")
            if min(datum.tokens) < 0 or max(datum.tokens) >= self.vocab_size:
                raise RequestError(f"{where}.model_input has a token outside the vocabulary (0..{self.vocab_size - 1})")
            for key in LOSS_INPUTS[request.loss_fn]:
                if key == "weights" and key not in datum.inputs:
                    continue  # cross_entropy without weights: every target counts once
                if key not in datum.inputs:
                    raise RequestError(f"{where}.loss_fn_inputs.{key} is required by {request.loss_fn}")
            targets = datum.inputs["target_tokens"]
            if targets.dim() not in (1, 2) or targets.shape[0] != len(datum.tokens):
                raise RequestError(f"{where}.loss_fn_inputs.target_tokens must have shape ({len(datum.tokens)},) "
                                   f"or ({len(datum.tokens)}, K); got {tuple(targets.shape)}")
            if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= self.vocab_size):
                raise RequestError(f"{where}.loss_fn_inputs.target_tokens has a token outside the vocabulary")
            for key, value in datum.inputs.items():
                if key != "target_tokens" and key in LOSS_INPUTS[request.loss_fn] and value.shape != targets.shape:
                    raise RequestError(f"{where}.loss_fn_inputs.{key} must have the shape of target_tokens "
                                       f"{tuple(targets.shape)}; got {tuple(value.shape)}")
                if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                    raise RequestError(f"{where}.loss_fn_inputs.{key} has a value that is not finite")

    def forward_backward(self, requests: Sequence[ForwardBackward]) -> list[ForwardBackwardResult | RequestError]:
        """One batched pass for all `requests` (each checked first; a wrong one fails alone). Where the
        batch as a whole fails, each request is run alone, so that only the failing one fails."""
        results: list[ForwardBackwardResult | RequestError | None] = [None] * len(requests)
        runnable: list[int] = []
        for index, request in enumerate(requests):
            try:
                self.check(request)
                runnable.append(index)
            except RequestError as exc:
                results[index] = exc
        if runnable:
            try:
                for index, result in zip(runnable, self._pass([requests[i] for i in runnable])):
                    results[index] = result
            except Exception as exc:  # noqa: BLE001 - a batch-wide failure: find whose it was
                if len(runnable) == 1:
                    results[runnable[0]] = RequestError(f"the pass failed: {type(exc).__name__}", "server")
                else:
                    for index in runnable:
                        results[index] = self.forward_backward([requests[index]])[0]
        return [result for result in results if result is not None]

    def _pass(self, requests: Sequence[ForwardBackward]) -> list[ForwardBackwardResult]:
        """The requests' rows in passes of at most `max_pass_tokens` (rows x padded width), each pass
        mixing whatever models its rows belong to; the gradients of the passes add up, as the
        losses are sums. A request's results are its rows' in order."""
        rows = [(index, datum) for index, request in enumerate(requests) for datum in request.data]
        logprobs: list[list[torch.Tensor]] = [[] for _ in requests]
        losses: list[list[torch.Tensor]] = [[] for _ in requests]
        sums = [0.0] * len(requests)
        for part in self._parts(rows):
            self._part_pass(requests, part, logprobs, losses, sums)
        return [ForwardBackwardResult(logprobs[i], losses[i], {"loss:sum": sums[i]}) for i in range(len(requests))]

    def _parts(self, rows: list[tuple[int, Datum]]) -> Iterator[list[tuple[int, Datum]]]:
        part: list[tuple[int, Datum]] = []
        width = 0
        for row in rows:
            wider = max(width, len(row[1].tokens))
            if part and wider * (len(part) + 1) > self.max_pass_tokens:
                yield part
                part, wider = [], len(row[1].tokens)
            part.append(row)
            width = wider
        if part:
            yield part

    def _part_pass(self, requests: Sequence[ForwardBackward], part: list[tuple[int, Datum]],
                   logprobs: list[list[torch.Tensor]], losses: list[list[torch.Tensor]], sums: list[float]) -> None:
        width = max(len(datum.tokens) for _index, datum in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for row, (_index, datum) in enumerate(part):
            ids[row, :len(datum.tokens)] = torch.tensor(datum.tokens)
            mask[row, :len(datum.tokens)] = 1
        runs: list[tuple[int, int, Adapter | None]] = []
        for row, (index, _datum) in enumerate(part):  # a request's rows are contiguous: one run each
            if runs and part[runs[-1][0]][0] == index:
                runs[-1] = (runs[-1][0], row + 1, runs[-1][2])
            else:
                runs.append((row, row + 1, self.adapters[requests[index].model]))
        trains = any(not requests[index].forward_only for index, _datum in part)
        with torch.enable_grad() if trains else torch.no_grad(), self._with_runs(runs):
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
            # every row's target logprobs at once: a slice of the logits per row would cost, in the
            # backward pass, a gradient the size of all the logits for each row
            lse = torch.logsumexp(logits, dim=-1)  # [rows, positions]
            targets = torch.zeros(len(part), width, dtype=torch.long)
            for row, (_index, datum) in enumerate(part):
                target = datum.inputs["target_tokens"]
                if target.dim() == 1:
                    targets[row, :len(datum.tokens)] = target
            all_lp = logits.gather(-1, targets.to(self.device).unsqueeze(-1)).squeeze(-1) - lse
            total: torch.Tensor | None = None
            for row, (index, datum) in enumerate(part):
                request = requests[index]
                target = datum.inputs["target_tokens"].to(self.device).long()
                n = len(datum.tokens)
                if target.dim() == 1:
                    lp = all_lp[row, :n]
                else:  # K targets per position (rare): this row's own gather
                    lp = logits[row, :n].gather(-1, target) - lse[row, :n].unsqueeze(-1)
                loss = self._datum_loss(request, datum, lp)
                logprobs[index].append(lp.detach().cpu())
                losses[index].append(loss.detach().cpu())
                summed = loss.sum()
                sums[index] += float(summed.detach())
                if not request.forward_only:
                    total = summed if total is None else total + summed
            if total is not None:
                total.backward()

    def _datum_loss(self, request: ForwardBackward, datum: Datum, lp: torch.Tensor) -> torch.Tensor:
        """The datum's token losses from its target logprobs `lp` (the shape of its target_tokens)."""
        inputs = {key: value.to(self.device).float() for key, value in datum.inputs.items() if key != "target_tokens"}
        if request.loss_fn == "cross_entropy":
            weights = inputs.get("weights")
            return -lp if weights is None else -lp * weights
        ratio = torch.exp(lp - inputs["logprobs"])
        advantages = inputs["advantages"]
        if request.loss_fn == "importance_sampling":
            return -ratio * advantages
        low = float(request.config.get("clip_low_threshold", 0.8))
        high = float(request.config.get("clip_high_threshold", 1.2))
        return -torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)

    def optim_step(self, name: str, params: AdamParams) -> dict[str, float]:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise RequestError(f"model {name} is not hosted")
        if not params.learning_rate >= 0 or not math.isfinite(params.learning_rate):
            raise RequestError("adam_params.learning_rate must be a finite number >= 0")
        if not (0 <= params.beta1 < 1 and 0 <= params.beta2 < 1):
            raise RequestError("adam_params.beta1 and beta2 must be in [0, 1)")
        return adapter.step(params)

    # sampling --------------------------------------------------------------------------------------
    def sample(self, name: str | None, prompt: list[int], *, num_samples: int, max_tokens: int,
               temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
               stop: list[str] | list[int] | None = None, seed: int | None = None,
               prompt_logprobs: bool = False) -> SampleResult:
        """One sample request alone (`sample_many`); its error raised."""
        (result,) = self.sample_many([SampleRequest(name, prompt, num_samples, max_tokens, temperature, top_k, top_p,
                                                    stop, seed, prompt_logprobs)])
        if isinstance(result, RequestError):
            raise result
        return result

    def _check_sample(self, request: SampleRequest) -> tuple[Adapter | None, set[int], list[str]]:
        prompt, max_tokens = request.prompt, request.max_tokens
        if not prompt or min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise RequestError("prompt is empty or has a token outside the vocabulary")
        if not 1 <= request.num_samples or max_tokens < 1:
            raise RequestError("num_samples and max_tokens must be at least 1")
        if self.context is not None and len(prompt) + max_tokens > self.context:
            raise RequestError(f"the prompt's {len(prompt)} tokens and max_tokens {max_tokens} exceed the base's "
                               f"context of {self.context}")
        if request.num_samples * (len(prompt) + max_tokens) > MAX_SAMPLE_BATCH_TOKENS:
            raise RequestError(f"num_samples x (prompt + max_tokens) is over {MAX_SAMPLE_BATCH_TOKENS} tokens; "
                               "ask for fewer samples per request")
        adapter = None
        if request.model is not None:
            adapter = self.adapters.get(request.model)
            if adapter is None:
                raise RequestError(f"model {request.model} is not hosted")
        return (adapter, *_stops(request.stop, self.tokenizer))

    @torch.no_grad()
    def sample_many(self, requests: Sequence[SampleRequest]) -> list[SampleResult | RequestError]:
        """Every request's `num_samples` completions in one batch over a key/value cache: the rows of
        all requests (of any models), prompts left-padded, one forward pass per new token for all.
        Each request draws its rows' tokens with its own generator and its own temperature, top-k and
        top-p. A sampled token's log-probability is the model's own (temperature 1, before top-k /
        top-p), the number `forward` gives for that token. `stop`: None stops at the
        end-of-sequence token, a list of token ids or of strings stops there (the stop included),
        [] never stops. The same requests with the same seeds give the same completions."""
        results: list[SampleResult | RequestError | None] = [None] * len(requests)
        plans: list[tuple[int, Adapter | None, set[int], list[str]]] = []
        for index, request in enumerate(requests):
            try:
                plans.append((index, *self._check_sample(request)))
            except RequestError as exc:
                results[index] = exc
        if plans:
            try:
                for index, result in zip([plan[0] for plan in plans], self._sample_batch(requests, plans)):
                    results[index] = result
            except Exception as exc:  # noqa: BLE001 - a batch-wide failure: each request alone finds whose
                if len(plans) == 1:
                    results[plans[0][0]] = RequestError(f"sampling failed: {type(exc).__name__}", "server")
                else:
                    for index, *_rest in plans:
                        results[index] = self.sample_many([requests[index]])[0]
        return [result for result in results if result is not None]

    def _sample_batch(self, requests: Sequence[SampleRequest],
                      plans: list[tuple[int, Adapter | None, set[int], list[str]]]) -> list[SampleResult]:
        spans: list[tuple[int, int]] = []  # each plan's rows
        prompts: list[list[int]] = []
        runs: list[tuple[int, int, Adapter | None]] = []
        for index, adapter, _ids, _texts in plans:
            request = requests[index]
            start = len(prompts)
            prompts.extend([request.prompt] * request.num_samples)
            spans.append((start, len(prompts)))
            runs.append((start, len(prompts), adapter))
        width = max(len(prompt) for prompt in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left-padded: every row's next token is at the end
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = []
        for index, *_rest in plans:
            generator = torch.Generator(device=self.device)
            seed = requests[index].seed
            generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
            generators.append(generator)
        rows = len(prompts)
        written: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        done = [False] * rows
        stopped = [False] * rows
        prompt_lps: list[list[float] | None] = [None] * len(plans)
        with self._with_runs(runs):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            for number, (index, *_rest) in enumerate(plans):
                if requests[index].prompt_logprobs:
                    prompt = requests[index].prompt
                    row, offset = spans[number][0], width - len(prompt)
                    own = torch.log_softmax(out.logits[row, offset:width - 1].float(), dim=-1)
                    values = own.gather(-1, ids[row, offset + 1:].unsqueeze(-1)).squeeze(-1).tolist()
                    prompt_lps[number] = [math.nan, *values]
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
            last = positions[:, -1]
            longest = max(requests[index].max_tokens for index, *_rest in plans)
            for step in range(longest):
                own = torch.log_softmax(logits, dim=-1)
                chosen = torch.zeros(rows, dtype=torch.long, device=self.device)
                for number, (index, _adapter, stop_ids, stop_texts) in enumerate(plans):
                    start, end = spans[number]
                    request = requests[index]
                    if step >= request.max_tokens or all(done[start:end]):
                        for row in range(start, end):
                            done[row] = True
                        continue
                    chosen[start:end] = _draw(logits[start:end], request.temperature, request.top_k,
                                              request.top_p, generators[number])
                    chosen_lp = own[start:end].gather(-1, chosen[start:end].unsqueeze(-1)).squeeze(-1).tolist()
                    for offset, token in enumerate(chosen[start:end].tolist()):
                        row = start + offset
                        if done[row]:
                            continue
                        written[row].append(token)
                        logprobs[row].append(chosen_lp[offset])
                        if token in stop_ids or (stop_texts and _ends_with_stop(written[row], stop_texts,
                                                                                 self.tokenizer)):
                            done[row] = stopped[row] = True
                        elif len(written[row]) >= request.max_tokens:
                            done[row] = True
                if all(done):
                    break
                mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype, device=self.device)], dim=-1)
                last = last + 1
                out = self.model(input_ids=chosen.unsqueeze(-1), attention_mask=mask, position_ids=last.unsqueeze(-1),
                                 past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits = out.logits[:, -1].float()
        return [SampleResult([Sampled(written[row], logprobs[row], stopped[row]) for row in range(*spans[number])],
                             prompt_lps[number]) for number in range(len(plans))]


def _kind(path: str, is_unembed: bool) -> str | None:
    if is_unembed:
        return "unembed"
    lowered = path.lower()
    if any(word in lowered for word in _ATTENTION_WORDS):
        return "attn"
    if any(word in lowered for word in _MLP_WORDS):
        return "mlp"
    return None


def _stops(stop: list[str] | list[int] | None, tokenizer: Any) -> tuple[set[int], list[str]]:
    if stop is None:
        eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        return ({int(eos)} if eos is not None else set()), []
    ids = {int(item) for item in stop if isinstance(item, int)}
    texts = [item for item in stop if isinstance(item, str) and item]
    if texts and tokenizer is None:
        raise RequestError("stop strings need the base model's tokenizer")
    return ids, texts


def _ends_with_stop(tokens: list[int], texts: list[str], tokenizer: Any) -> bool:
    tail = tokenizer.decode(tokens[-32:], skip_special_tokens=False)
    longest = max(len(text) for text in texts)
    window = tail[-(longest + 16):]
    return any(text in window for text in texts)


def _draw(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
          generator: torch.Generator) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1)
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if 0 < top_p < 1:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
        cut = cumulative - torch.softmax(ordered, dim=-1) >= top_p  # keep the smallest set reaching top_p
        ordered = ordered.masked_fill(cut, -math.inf)
        scaled = torch.full_like(scaled, -math.inf).scatter(-1, order, ordered)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
