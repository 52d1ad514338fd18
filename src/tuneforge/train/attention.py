"""Attention over packed rows without an L x L mask: each example of a row attends only to itself.

A packed row holds several examples back to back, its position ids restarting at 0 for each.
Keeping them apart with a block-diagonal mask costs rows x L x L booleans and keeps SDPA off
its fused kernels (a masked SDPA is the math kernel: the L x L scores in memory). Instead:

- `flash_attention_2` / `_3` (CUDA, flash-attn installed): transformers reads the example
  boundaries off the position ids and calls the variable-length kernels itself.
- `VARLEN` ("tuneforge_varlen", registered here with transformers' attention interface):
  wherever the above is not available (CPU, CUDA without flash-attn), one causal SDPA per
  example, cut out of the row by the same position ids. No mask is built (the mask interface
  answers None for it), and a causal SDPA without a mask runs PyTorch's flash or
  memory-efficient kernel on CPU and CUDA alike: memory grows with the tokens, not their
  square. A sliding window shorter than an example gets that example's own banded mask.

Whether a loaded model keeps its examples apart this way is not assumed: `choose` runs two
short sequences through the model packed and one by one and takes the varlen path only when
the logits agree (a model whose attention does not receive the position ids, soft-capped
scores, chunked or linear attention layers fail that check). Otherwise the trainer packs with
the 4-D mask (`batches.collate_packed`)."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

VARLEN = "tuneforge_varlen"
FLASH = ("flash_attention_2", "flash_attention_3")
# transformers' own variable-length paths and ours: packed rows need no mask with these
NO_MASK = (*FLASH, VARLEN)
_CHECK_LENGTHS = (7, 5)  # the self-check's two sequences, packed into one row of 12
_CHECK_TOLERANCE = 1e-3  # of logits, relative to their scale


def segments(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the (start, end) of each example: a new one wherever the position does not
    follow the previous by one (at 0, and where a padding slot's 0 follows anything)."""
    rows = []
    positions = position_ids.tolist()
    for row in positions:
        starts = [index for index, value in enumerate(row) if index == 0 or value != row[index - 1] + 1]
        rows.append(list(zip(starts, starts[1:] + [len(row)])))
    return rows


def _window_of(module: Any, kwargs: dict[str, Any]) -> int | None:
    window = kwargs.get("sliding_window")
    if window is None:
        window = getattr(module, "sliding_window", None)
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def varlen_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query [batch, heads, length, dim], key and value
    [batch, kv heads, length, dim]; answers [batch, length, heads, dim] and no weights.

    What is not a packed training row — a mask given (padded batches), no position ids, or
    queries shorter than the keys (generation with a cache: the evaluation after training) —
    goes to transformers' own SDPA attention, as the model would have run it."""
    if kwargs.get("softcap") is not None:
        raise ValueError("varlen attention does not soft-cap scores")
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or position_ids is None or query.shape[2] != key.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if position_ids.shape[0] != query.shape[0]:
        position_ids = position_ids.expand(query.shape[0], -1)
    window = _window_of(module, kwargs)
    grouped = query.shape[1] != key.shape[1]
    dropout = dropout if module.training else 0.0
    output = torch.empty_like(query)
    for row, spans in enumerate(segments(position_ids)):
        for start, end in spans:
            q = query[row:row + 1, :, start:end]
            k = key[row:row + 1, :, start:end]
            v = value[row:row + 1, :, start:end]
            length = end - start
            if window is not None and length > window:  # a banded causal mask for this example only
                slots = torch.arange(length, device=query.device)
                band = (slots[:, None] >= slots[None, :]) & (slots[:, None] - slots[None, :] < window)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=band, dropout_p=dropout, scale=scaling,
                                                     enable_gqa=grouped)
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scaling,
                                                     enable_gqa=grouped)
            output[row:row + 1, :, start:end] = out
    return output.transpose(1, 2).contiguous(), None


def _mask(*args: Any, **kwargs: Any) -> Any:
    """The mask transformers builds for `VARLEN`: none for packed rows (the attention cuts the
    examples out itself); SDPA's own where the caller gave a padding mask."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Make `VARLEN` an attention implementation transformers models accept (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, _mask)


def implementation(model: Any) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", "") or "")


def _set(model: Any, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(name)
    else:  # an older transformers: the config field is what the layers read
        model.config._attn_implementation = name


def keeps_examples_apart(model: Any) -> bool:
    """Two short sequences through `model` packed in one row (position ids restarting, no mask)
    give the logits they give one by one."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab < 2:
        return False
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randint(0, vocab, (1, n), generator=generator).to(device) for n in _CHECK_LENGTHS]
    positions = torch.cat([torch.arange(n) for n in _CHECK_LENGTHS]).unsqueeze(0).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            alone = [model(input_ids=part, use_cache=False).logits.float() for part in parts]
            if implementation(model) not in FLASH:
                _set(model, VARLEN)
            packed = model(input_ids=torch.cat(parts, dim=1), position_ids=positions, use_cache=False).logits.float()
    finally:
        model.train(was_training)
    expected = torch.cat(alone, dim=1)
    scale = float(expected.abs().max()) or 1.0
    return bool(torch.isfinite(packed).all()) and float((packed - expected).abs().max()) <= _CHECK_TOLERANCE * scale


def choose(model: Any) -> str:
    """Set the attention `model` trains packed rows with and answer it: flash-attention's own
    (kept when loaded with it), else `VARLEN` when the self-check passes, else the implementation
    it was loaded with (the trainer then builds the 4-D mask)."""
    loaded = implementation(model)
    if loaded in FLASH:
        return loaded
    register()
    try:
        if keeps_examples_apart(model):
            return VARLEN
        reason = "packed logits differ from one-by-one logits"
    except Exception as exc:  # noqa: BLE001 - an architecture whose attention cannot take this path
        reason = f"{type(exc).__name__}: {exc}"
    _set(model, loaded)
    log.info("packing with a block-diagonal mask (%s attention): %s", loaded or "default", reason)
    return loaded
