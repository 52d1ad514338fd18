"""Training data inside the trainer: load, order, pad, and score token predictions."""

from __future__ import annotations

import bisect
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tuneforge.data.errors import BadDataError
from tuneforge.data.example import DataIssue
from tuneforge.data.formats import parse_jsonl_line
from tuneforge.data.reader import iter_jsonl
from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample, tokenize_example
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore
from tuneforge.train import attention, fused_loss, token_shards
from tuneforge.train.errors import UserInputError

TOKENIZED_FORMAT_VERSION = token_shards.FORMAT_VERSION


def load_tokenized(
    store: ObjectStore, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
    base_model_sha256: str = "",
) -> Sequence[TokenizedExample]:
    """Every example of a JSONL file in the store, tokenized, never the whole file in memory
    (`train/token_shards.py`); `BadDataError`s name the line. A prepared dataset larger than
    `token_shards.TOKENIZE_AHEAD_MAX_BYTES` is tokenized on demand, an example when a step reads
    it; anything smaller is tokenized ahead into shards (cached in the store)."""
    def encode(record: Any) -> Iterator[TokenizedExample]:
        yield tokenize_example(record, tokenizer, max_seq_length=hp.max_seq_length,
                               train_on_inputs=hp.train_on_inputs)

    if layout.tokenized_key(ref.key, "x") is not None and \
            store.size_bytes(ref.key) > token_shards.TOKENIZE_AHEAD_MAX_BYTES:
        return _on_demand(store, ref, lambda record: next(encode(record)), label)
    return stream_tokenized(store, ref, tokenizer, hp, encode, label=label, kind="chat",
                            base_model_sha256=base_model_sha256)


def _on_demand(store: ObjectStore, ref: DataFileRef, encode: Callable[[Any], TokenizedExample],
               label: str) -> token_shards.OnDemand:
    """A prepared file (one example a line, as the control plane wrote it) copied to local disk
    and read an example at a time."""
    folder = Path(tempfile.mkdtemp(prefix="tuneforge-tokens-"))
    try:
        path = folder / "data.jsonl"
        store.get_file(ref.key, path)

        def example(line_number: int, raw: bytes) -> TokenizedExample:
            value = parse_jsonl_line(raw, line_number)
            try:
                if isinstance(value, DataIssue):
                    raise BadDataError(value.code, value.message, line_number=line_number)
                return encode(value)
            except BadDataError as exc:
                raise BadDataError(exc.code, f"{label} file: {exc.detail}", line_number=line_number,
                                   param=exc.param) from None

        examples = token_shards.OnDemand(path, example, owned=folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if not len(examples):
        examples.close()
        raise BadDataError("empty_file", f"the {label} file has no examples")
    return examples


def stream_tokenized(
    store: ObjectStore, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters,
    encode: Callable[[Any], Iterable[TokenizedExample]], *, label: str, kind: str, base_model_sha256: str = "",
) -> token_shards.TokenShards:
    """The examples `encode` makes of each line of a JSONL file, as shards on local disk.

    A prepared dataset's shards are cached beside it, keyed by the base model
    (tokenizer and chat template are part of its SHA), max_seq_length,
    train_on_inputs and `kind` (how a line is encoded): a later job or attempt
    on the same data downloads them instead of tokenizing again.
    """
    ident = hashlib.sha256(
        f"{TOKENIZED_FORMAT_VERSION}|{kind}|{base_model_sha256}|{hp.max_seq_length}|{hp.train_on_inputs}".encode()
    ).hexdigest()[:24]
    prefix = layout.tokenized_prefix(ref.key, ident) if base_model_sha256 else None
    if prefix:
        cached = token_shards.fetch(store, prefix)
        if cached is not None:
            return cached
    shards = token_shards.build(_encoded_lines(store, ref, encode, label), vocab_size_of(tokenizer),
                                store=store if prefix else None, prefix=prefix)
    if not len(shards):
        shards.close()
        raise BadDataError("empty_file", f"the {label} file has no examples")
    return shards


def vocab_size_of(tokenizer: Any) -> int:
    """Every id the tokenizer can produce, added tokens included."""
    return max(len(tokenizer), int(getattr(tokenizer, "vocab_size", 0) or 0))


def _encoded_lines(store: ObjectStore, ref: DataFileRef, encode: Callable[[Any], Iterable[TokenizedExample]],
                   label: str) -> Iterator[TokenizedExample]:
    line_number = 0
    try:
        with store.open_read(ref.key) as stream:
            for line_number, record in iter_jsonl(stream):  # noqa: B007 - the except clauses read it
                yield from encode(record)
    except BadDataError as exc:
        raise BadDataError(
            exc.code, f"{label} file: {exc.detail}",
            line_number=exc.line_number or line_number, param=exc.param,
        ) from None
    except UnicodeError as exc:  # e.g. a compressed stream that does not decode
        raise BadDataError(
            "unreadable_file", f"the {label} file could not be read as UTF-8 JSON lines ({exc.reason})",
            line_number=line_number + 1,
        ) from None


def target_token_count(example: TokenizedExample) -> int:
    """Tokens that are predicted with loss: the model never predicts position 0."""
    return token_shards.example_units(example)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled example order of one epoch, a pure function of (seed, epoch): a seeded
    permutation of every index (8 bytes an example, the one per-example array of the epoch).

    Resuming at (epoch, index) recomputes this order and slices it, so no
    example is read again to find the place.
    """
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor
    # 2-D padding mask, 4-D block-diagonal causal mask, one such mask per attention layer type
    # (a model whose layers attend over different spans), or None
    attention_mask: torch.Tensor | dict[str, torch.Tensor] | None
    labels: torch.Tensor
    num_tokens: int  # real (non-pad) tokens
    position_ids: torch.Tensor | None = None  # restart at 0 for every packed example
    num_slots: int = 0  # tokens the forward pass computes, padding included

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.num_tokens / self.num_slots if self.num_slots else 0.0


def collate(examples: list[TokenizedExample], pad_token_id: int, device: torch.device) -> MicroBatch:
    """Right-pad to the longest example of this micro-batch only (dynamic padding)."""
    length = max(len(example.input_ids) for example in examples)
    input_ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        size = len(example.input_ids)
        input_ids[row, :size] = torch.tensor(example.input_ids)
        labels[row, :size] = torch.tensor(example.labels)
        attention_mask[row, :size] = 1
    return MicroBatch(
        input_ids.to(device), attention_mask.to(device), labels.to(device),
        num_tokens=sum(len(example.input_ids) for example in examples), num_slots=len(examples) * length,
    )


def pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: indices grouped into rows of at most `capacity` tokens.

    Longest first; each goes into the row with the least room that still fits
    it, else a new row. Deterministic (ties by index), so a resumed step packs
    exactly as the first attempt did."""
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        size = min(lengths[index], capacity)
        at = bisect.bisect_left(room, (size, -1))
        if at < len(room):
            free, row = room.pop(at)
            rows[row].append(index)
            bisect.insort(room, (free - size, row))
        else:
            rows.append([index])
            bisect.insort(room, (capacity - size, len(rows) - 1))
    return rows


FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def packed_mask_options(model: Any) -> dict[str, Any]:
    """The keyword arguments of `collate_packed` that mask attention the way `model` attends
    when it reads one example alone.

    A 4-D mask handed to a transformers model is used as given, so it has to be in the form
    the model's attention implementation takes (SDPA: booleans; eager and the others: a
    float mask added to the scores) and hold the sliding windows of its layers (Mistral's,
    Gemma 2/3's local layers, ...): one mask limited to the window when every layer slides,
    one mask per layer type (full, sliding) when the layers differ. Flash-attention's
    variable-length kernels take no mask: the position ids mark where examples start.
    Layers of any other kind (chunked or linear attention, state-space layers) would let
    one packed example see another: refused."""
    config = model.config
    implementation = getattr(config, "_attn_implementation", None) or ""
    if implementation in attention.NO_MASK:  # variable-length attention: the position ids suffice
        return {"block_mask": False}
    options: dict[str, Any] = {"mask_dtype": None if implementation == "sdpa" else model.dtype}
    window = getattr(config, "sliding_window", None)
    window = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
    kinds = set(getattr(config, "layer_types", None) or ())
    if not kinds:  # no per-layer types: the config's window, if any, applies to every layer
        return {**options, "window": window}
    unknown = kinds - {FULL_ATTENTION, SLIDING_ATTENTION}
    if unknown:
        raise UserInputError(
            "packing_unsupported",
            f"packing cannot keep the examples of a row apart in this base model's {', '.join(sorted(unknown))} "
            "layers; set hyperparameters.packing to false",
            param="hyperparameters.packing",
        )
    spans = {kind: window if kind == SLIDING_ATTENTION else None for kind in kinds}
    if len(set(spans.values())) == 1:  # every layer attends the same way: one mask fits all
        return {**options, "window": next(iter(spans.values()))}
    return {**options, "window": spans}


def _block_causal_mask(segments: torch.Tensor, window: int | None, dtype: torch.dtype | None) -> torch.Tensor:
    """[rows, 1, length, length]: a slot attends to the earlier slots of its own example (only
    the `window` latest, itself included, when given). Booleans (True: attends), or with a
    `dtype` the additive form eager attention takes (0 where it attends, the dtype's lowest
    value elsewhere)."""
    length = segments.shape[1]
    slots = torch.arange(length)
    allowed = slots[:, None] >= slots[None, :]
    if window is not None:
        allowed &= slots[:, None] - slots[None, :] < window
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] >= 0)
    mask = (same & allowed)[:, None]
    # a padding slot attends to itself only, so no row of the mask is empty (no NaN from softmax)
    mask[:, 0, slots, slots] |= segments < 0
    if dtype is None:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)


def collate_packed(rows: list[list[TokenizedExample]], pad_token_id: int, device: torch.device,
                   *, block_mask: bool = True, window: int | Mapping[str, int | None] | None = None,
                   mask_dtype: torch.dtype | None = None) -> MicroBatch:
    """Each row is several examples back to back. Position ids restart at 0 for
    every example; the first token of an example is never a target (in a row of
    its own it is predicted from nothing), so no loss crosses a boundary; and
    attention stays inside each example: a block-diagonal causal mask (4-D, for
    eager/SDPA attention), or — `block_mask=False`, for flash-attention's
    variable-length kernels — the position ids alone mark where examples start.

    `packed_mask_options` says which mask a model needs. `window`: None, a slot
    sees every earlier slot of its example; an int, only that many latest (a
    sliding window); a mapping, one mask per layer type, each with its own
    window. `mask_dtype`: None, a boolean mask (SDPA); a float dtype, the
    additive mask eager attention takes."""
    length = max(sum(len(example.input_ids) for example in row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    segments = torch.full((len(rows), length), -1, dtype=torch.long)  # which example a slot holds (-1: padding)
    real = 0
    for r, row in enumerate(rows):
        start = 0
        for number, example in enumerate(row):
            size = len(example.input_ids)
            input_ids[r, start:start + size] = torch.tensor(example.input_ids)
            labels[r, start:start + size] = torch.tensor(example.labels)
            labels[r, start] = IGNORE_INDEX
            position_ids[r, start:start + size] = torch.arange(size)
            segments[r, start:start + size] = number
            start += size
        if not block_mask:  # the row's padding as one run: one segment for a variable-length kernel
            position_ids[r, start:] = torch.arange(length - start)
        real += start
    attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None
    if block_mask and isinstance(window, Mapping):
        attention_mask = {kind: _block_causal_mask(segments, span, mask_dtype).to(device)
                          for kind, span in window.items()}
    elif block_mask:
        attention_mask = _block_causal_mask(segments, window, mask_dtype).to(device)
    return MicroBatch(
        input_ids.to(device), attention_mask, labels.to(device), num_tokens=real,
        position_ids=position_ids.to(device), num_slots=len(rows) * length,
    )


def step_micro_batches(examples: list[TokenizedExample], hp: Hyperparameters) -> list[list[list[TokenizedExample]]]:
    """The forward passes of one optimizer step: with packing, rows of up to
    `max_seq_length` tokens, `micro_batch_size` rows at a time (the same memory
    bound as `micro_batch_size` examples of the longest length); without,
    `micro_batch_size` examples, each its own row."""
    if not hp.packing:
        return [[[example] for example in chunk] for chunk in micro_batches(examples, hp.micro_batch_size)]
    rows = [[examples[i] for i in row] for row in pack([len(e.input_ids) for e in examples], hp.max_seq_length)]
    size = max(1, hp.micro_batch_size)
    return [rows[start:start + size] for start in range(0, len(rows), size)]


def micro_batches(examples: list[TokenizedExample], micro_batch_size: int) -> list[list[TokenizedExample]]:
    size = max(1, micro_batch_size)
    return [examples[start:start + size] for start in range(0, len(examples), size)]


@dataclass(frozen=True)
class TokenScores:
    loss_sum: torch.Tensor  # summed cross-entropy over target tokens (keeps the graph)
    correct: int
    count: int


def score_tokens(model: Any, batch: MicroBatch, *, fused: str = "off") -> TokenScores:
    """Next-token cross-entropy summed over target tokens, and argmax hits. `fused`
    ("chunked", "liger"): without the logits, where the model allows (`train/fused_loss.py`).

    Summing (not averaging) per micro-batch lets the caller divide by the
    target tokens of the whole optimizer step, so gradient accumulation weighs
    every token equally however the step is split.
    """
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    if batch.position_ids is not None:
        inputs["position_ids"] = batch.position_ids
    if fused != "off" and fused_loss.head_of(model, gather=False) is not None:
        # the output layer and the loss a chunk at a time (train/fused_loss.py)
        with fused_loss.hidden_states_instead_of_logits(model) as captured:
            model(**inputs)
        head = fused_loss.head_of(model)  # again: a sharded model's output layer is gathered only now
        hidden = captured[-1][:, :-1]
        targets = batch.labels[:, 1:]
        score = fused_loss.liger_token_loss if fused == "liger" else fused_loss.chunked_token_loss
        loss_sum, correct = score(hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1), head)
        return TokenScores(loss_sum=loss_sum, correct=correct, count=int((targets != IGNORE_INDEX).sum()))
    logits = model(**inputs).logits
    logits = logits[:, :-1].float()
    targets = batch.labels[:, 1:]
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )
    mask = targets != IGNORE_INDEX
    with torch.no_grad():
        correct = int(((logits.argmax(dim=-1) == targets) & mask).sum())
    return TokenScores(loss_sum=loss_sum, correct=correct, count=int(mask.sum()))
