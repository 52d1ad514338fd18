"""The output layer and the token loss in one pass, without the B x S x V logits.

At the loss of a model with a large vocabulary the plain path keeps three fp32 B·S·V
buffers alive (the logits, their fp32 copy, the log-softmax kept for backward: the memory
model's `logits` term, 12·T·V bytes), often the peak of a small model's step. Here the
output layer's input (the final hidden states) is taken instead of its output, and the loss
is computed a chunk of tokens at a time:

- `chunked` (any device, pure torch): for each chunk, its logits, their log-sum-exp, the
  summed cross-entropy, the argmax hits, and already the gradient of the loss with respect
  to the chunk's hidden states (and to the output weight, when it trains), so nothing of the
  chunk is kept; backward only scales those gradients by the incoming one. One chunk's
  logits at a time instead of all of them, and no recomputation.
- `liger` (CUDA with the `liger-kernel` package): Liger's fused linear cross-entropy
  Triton kernel computes the loss the same way; the argmax hits come from a no-grad pass
  over the same chunks.

Which one runs is the trainer's setting `TUNEFORGE_FUSED_LOSS` (`JobSpec.fused_loss`):
`off`, `chunked`, `liger`, or `auto` (liger where it can run, else chunked). The path is
taken only where its result is the plain path's: a linear output layer without bias, a model
whose logits are only soft-capped (Gemma) or scaled by a known factor after it; anywhere
else the plain path runs. With FSDP the output layer's weight is read after the model's
forward pass, while the outermost unit (which holds it) is still gathered; its gradient goes
to that gathered weight, which FSDP reduce-scatters to the shards as any other.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tuneforge.data.tokenize import IGNORE_INDEX

log = logging.getLogger(__name__)

MODES = ("auto", "off", "chunked", "liger")
CHUNK_LOGITS = 1 << 25  # logits alive at a time (fp32: 128 MiB): 1,024 tokens at a 32k vocabulary, 220 at 152k
MIN_CHUNK_TOKENS = 16
# config fields of models that transform their logits in ways this path does not reproduce
_OTHER_LOGIT_SCALINGS = ("output_multiplier_scale", "mup_width_multiplier", "logit_soft_cap")


def chunk_tokens(vocab: int) -> int:
    """Tokens a chunk: as many as keep its logits within `CHUNK_LOGITS` (each chunk reads the
    whole output weight, so not fewer than `MIN_CHUNK_TOKENS`)."""
    return max(MIN_CHUNK_TOKENS, CHUNK_LOGITS // max(1, vocab))


@dataclass(frozen=True)
class Head:
    """How a model turns its final hidden states into logits."""

    weight: torch.Tensor
    softcap: float = 0.0  # logits = softcap * tanh(logits / softcap)
    scale: float = 1.0  # logits = scale * logits (Cohere's logit_scale, 1 / Granite's logits_scaling)


def liger_available(device: torch.device) -> bool:
    return device.type == "cuda" and importlib.util.find_spec("liger_kernel") is not None


def resolve_mode(mode: str, device: torch.device) -> str:
    """The path `mode` means on `device`: "off", "chunked" or "liger"."""
    mode = (mode or "off").lower()
    if mode not in MODES:
        raise ValueError(f"fused loss {mode!r}: use one of {', '.join(MODES)}")
    if mode == "auto":
        return "liger" if liger_available(device) else "chunked"
    if mode == "liger" and not liger_available(device):
        log.warning("fused loss 'liger' needs a CUDA GPU and the liger-kernel package: the chunked path runs")
        return "chunked"
    return mode


def head_of(model: Any, *, gather: bool = True) -> Head | None:
    """The output layer's weight and what the model does to its logits, or None when the fused
    path would not give the plain path's result. `gather` False: a sharded weight as it is
    (only whether the path applies is asked)."""
    from tuneforge.train.distributed import unwrap

    inner = unwrap(model)
    output = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if type(output) is not torch.nn.Linear or output.bias is not None:
        return None
    config = getattr(inner, "config", None)
    if any(getattr(config, name, None) not in (None, 0, 1) for name in _OTHER_LOGIT_SCALINGS):
        return None  # another post-processing of the logits: the plain path is the faithful one
    softcap = float(getattr(config, "final_logit_softcapping", None) or 0.0)
    scale = float(getattr(config, "logit_scale", None) or 1.0) / float(getattr(config, "logits_scaling", None) or 1.0)
    weight = output.weight
    # sharded and not gathered now: gathered, gradients flow back to the shards
    if gather and hasattr(weight, "full_tensor"):
        weight = weight.full_tensor()
    return Head(weight, softcap, scale)


@contextlib.contextmanager
def hidden_states_instead_of_logits(model: Any) -> Iterator[list[torch.Tensor]]:
    """While open, the model's output layer gets zero positions (so the model computes no
    logits) and the hidden states it would have got land in the yielded list."""
    from tuneforge.train.distributed import unwrap

    output = unwrap(model).get_output_embeddings()
    captured: list[torch.Tensor] = []

    def take(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        captured.append(hidden)
        return (hidden[..., :0, :], *args[1:])

    handle = output.register_forward_pre_hook(take)
    try:
        yield captured
    finally:
        handle.remove()


def final_logits(hidden: torch.Tensor, head: Head) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 logits of `hidden` (any positions) as the model would make them (`_chunk_logits`)."""
    return _chunk_logits(hidden, head)


def _chunk_logits(hidden: torch.Tensor, head: Head) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 logits of a chunk as the model would make them, and d(final)/d(raw) for soft-capping."""
    logits = (hidden @ head.weight.t()).float()
    if head.scale != 1.0:
        logits = logits * head.scale
    if head.softcap:
        capped = torch.tanh(logits / head.softcap)
        return capped * head.softcap, 1.0 - capped * capped
    return logits, None


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `hidden @ weight.T` against `targets`, a chunk at a time; the
    gradients are made in the forward pass (see the module's docstring)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float,
                scale: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        head = Head(weight, softcap, scale)
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            part, wanted = hidden[start:start + chunk], targets[start:start + chunk]
            valid = wanted != IGNORE_INDEX
            if not bool(valid.any()):
                continue
            logits, capped_slope = _chunk_logits(part, head)
            safe = wanted.clamp(min=0).unsqueeze(1)
            log_z = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, safe).squeeze(1)
            loss += ((log_z - picked) * valid).sum()
            correct += ((logits.argmax(dim=-1) == wanted) & valid).sum()
            if not (want_hidden or want_weight):
                continue
            grad = logits.sub_(log_z.unsqueeze(1)).exp_()  # the softmax, in the logits' own memory
            grad.scatter_add_(1, safe, -torch.ones_like(safe, dtype=grad.dtype))
            grad *= valid.unsqueeze(1)
            if capped_slope is not None:
                grad *= capped_slope
            if scale != 1.0:
                grad *= scale
            grad = grad.to(part.dtype)
            if want_hidden:
                grad_hidden[start:start + chunk] = grad @ weight
            if want_weight and part.dtype == torch.float32:
                grad_weight.addmm_(grad.t(), part)  # no temporary the size of the output weight
            elif want_weight:
                grad_weight += (grad.t() @ part).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_correct: Any) -> tuple[Any, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss.to(torch.float32)
        hidden = None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype)
        weight = None if grad_weight is None else (grad_weight * scale).to(ctx.weight_dtype)
        return hidden, weight, None, None, None, None


def chunked_token_loss(hidden: torch.Tensor, targets: torch.Tensor, head: Head,
                       chunk: int = 0) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy and argmax hits; `hidden` (N, h), `targets` (N,);
    `chunk` tokens at a time (0: `chunk_tokens` of the vocabulary)."""
    weight = head.weight
    chunk = chunk or chunk_tokens(weight.shape[0])
    loss, correct = _ChunkedCrossEntropy.apply(hidden, weight, targets, head.softcap, head.scale, chunk)
    return loss, int(correct)


def liger_token_loss(hidden: torch.Tensor, targets: torch.Tensor, head: Head) -> tuple[torch.Tensor, int]:
    """The same through Liger's fused linear cross-entropy kernel (CUDA); hits from a no-grad pass."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    weight = head.weight
    chunk = chunk_tokens(weight.shape[0])
    if head.scale != 1.0:  # Liger has no logit scale: fold it into the input
        hidden = hidden * head.scale
    loss_fn = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum",
                                               softcap=head.softcap or None)
    loss = loss_fn(weight, hidden, targets)
    correct = 0
    with torch.no_grad():
        for start in range(0, hidden.shape[0], chunk):
            wanted = targets[start:start + chunk]
            logits, _ = _chunk_logits(hidden[start:start + chunk], Head(weight, head.softcap, 1.0))
            correct += int(((logits.argmax(dim=-1) == wanted) & (wanted != IGNORE_INDEX)).sum())
    return loss.float(), correct
