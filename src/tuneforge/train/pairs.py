"""Functions the preference methods share (`methods/dpo.py`, `orpo.py`, `kto.py`):
tokenizing prompt + answer sequences, scoring the log-probability of answers in
one packed forward pass, and reference log-probabilities computed once with
the adapter switched off.

A sequence is a prompt conversation plus one assistant answer, tokenized with
the model's chat template; only the answer's tokens (its end-of-turn markup
included) are targets. Assistant turns inside the prompt are context, never
targets. A sequence's *log-probability* is the sum of the log-probabilities of
its answer tokens.

Reference log-probabilities (DPO, KTO) are computed once per dataset before
training — with the adapter switched off, so no second model is held — and
kept in the object store beside the prepared dataset (keyed by base model and
max_seq_length): later attempts and later jobs on the same data read them
instead of recomputing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tuneforge.data.errors import BadDataError
from tuneforge.data.reader import iter_jsonl
from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample, tokenize_chat
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.storage import layout
from tuneforge.train.batches import collate, collate_packed, pack, packed_mask_options
from tuneforge.train.run import Run

log = logging.getLogger(__name__)

REFERENCE_FORMAT_VERSION = 1


def prompt_context(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The `input.messages` of a prepared preference line, every turn as context."""
    prompt = record.get("input") or {}
    messages = prompt.get("messages") if isinstance(prompt, dict) else None
    if not isinstance(messages, list) or not messages:
        raise BadDataError("invalid_example", "'input.messages' must be a non-empty list", param="input.messages")
    return [{**message, "weight": 0} if message.get("role") == "assistant" else message for message in messages]


def prompt_tools(record: dict[str, Any]) -> dict[str, Any]:
    """The `input.tools` and `input.parallel_tool_calls` of a preference line, as `tokenize_chat`
    takes them: the chat template renders the prompt with them, as at inference."""
    prompt = record.get("input") or {}
    if not isinstance(prompt, dict):
        return {}
    return {"tools": prompt.get("tools"), "parallel_tool_calls": prompt.get("parallel_tool_calls")}


def answer_sequence(context: list[dict[str, Any]], answer: Any, key: str, tokenizer: Any, *,
                    max_seq_length: int, tools: dict[str, Any] | None = None) -> TokenizedExample:
    """`context` plus the one assistant message of `answer` (a list holding it), answer tokens as
    targets; `tools`: `prompt_tools` of the line."""
    if not isinstance(answer, list) or len(answer) != 1 or not isinstance(answer[0], dict):
        raise BadDataError("invalid_example", f"'{key}' must hold one assistant message", param=key)
    turn = {**answer[0], "role": "assistant", "weight": 1}
    sequence = tokenize_chat(context + [turn], tokenizer, max_seq_length=max_seq_length, **(tools or {}))
    if sequence.num_loss_tokens == 0:
        raise BadDataError("example_too_long", f"the prompt fills max_seq_length ({max_seq_length}) and leaves "
                                               f"no room for '{key}'", param=key)
    return sequence


@dataclass(frozen=True)
class PairExample:
    chosen: TokenizedExample
    rejected: TokenizedExample
    index: int  # position in its file: where its reference log-probabilities are kept
    split: str  # "training" or "validation"


def tokenize_pair(record: dict[str, Any], tokenizer: Any, *, max_seq_length: int) -> tuple[TokenizedExample, ...]:
    context = prompt_context(record)
    tools = prompt_tools(record)
    return tuple(answer_sequence(context, record.get(key), key, tokenizer, max_seq_length=max_seq_length,
                                 tools=tools)
                 for key in ("preferred_output", "non_preferred_output"))


def read_records(store: Any, ref: DataFileRef, *, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) of a prepared file; a `BadDataError` raised while handling one names the file and line."""
    line_number = 0
    try:
        with store.open_read(ref.key) as stream:
            for line_number, record in iter_jsonl(stream):
                yield line_number, record
    except BadDataError as exc:
        raise BadDataError(exc.code, f"{label} file: {exc.detail}",
                           line_number=exc.line_number or line_number, param=exc.param) from None


def load_pairs(store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *,
               label: str) -> list[PairExample]:
    pairs: list[PairExample] = []
    for _line, record in read_records(store, ref, label=label):
        chosen, rejected = tokenize_pair(record, tokenizer, max_seq_length=hp.max_seq_length)
        pairs.append(PairExample(chosen, rejected, len(pairs), label))
    if not pairs:
        raise BadDataError("empty_file", f"the {label} file has no examples")
    return pairs


def example_chunks(examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
    """`micro_batch_size` examples per forward pass (each puts all its sequences through it)."""
    size = max(1, hp.micro_batch_size)
    return [examples[start:start + size] for start in range(0, len(examples), size)]


@dataclass(frozen=True)
class AnswerLogps:
    sums: torch.Tensor  # summed answer-token log-probabilities, one per sequence
    counts: torch.Tensor  # answer tokens per sequence (at least 1)
    num_tokens: int
    num_slots: int


def answer_logps(model: Any, rows: list[list[TokenizedExample]], run: Run) -> AnswerLogps:
    """Log-probabilities of the answers of every sequence in `rows` (rows of packed
    sequences, or one sequence per row without packing), in row order."""
    if run.spec.hyperparameters.packing:
        batch = collate_packed(rows, run.tokenizer.pad_token_id, run.device, **packed_mask_options(run.model))
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                  "position_ids": batch.position_ids, "use_cache": False}
    else:
        batch = collate([row[0] for row in rows], run.tokenizer.pad_token_id, run.device)
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    logits = model(**inputs).logits[:, :-1].float()
    targets = batch.labels[:, 1:]
    mask = targets != IGNORE_INDEX
    token_logps = -F.cross_entropy(logits.transpose(1, 2), targets.clamp(min=0), reduction="none") * mask
    sums, counts = [], []
    for r, row in enumerate(rows):
        start = 0
        for sequence in row:
            size = len(sequence.input_ids)
            # a sequence at [start, start+size) is scored by the logits at [start, start+size-1)
            sums.append(token_logps[r, start:start + size - 1].sum())
            counts.append(mask[r, start:start + size - 1].sum())
            start += size
    return AnswerLogps(torch.stack(sums), torch.stack(counts).clamp(min=1), batch.num_tokens, batch.num_slots)


def sequence_logps(model: Any, sequences: list[TokenizedExample], run: Run) -> AnswerLogps:
    """Answer log-probabilities of `sequences` in one forward pass, in the order given
    (packed into rows of `max_seq_length` tokens when the job packs)."""
    hp = run.spec.hyperparameters
    if hp.packing:
        placed = [sorted(row) for row in pack([len(s.input_ids) for s in sequences], hp.max_seq_length)]
    else:
        placed = [[n] for n in range(len(sequences))]
    result = answer_logps(model, [[sequences[n] for n in row] for row in placed], run)
    order = [n for row in placed for n in row]  # sequence number of each result
    back = torch.empty(len(order), dtype=torch.long, device=result.sums.device)
    back[torch.tensor(order, device=result.sums.device)] = torch.arange(len(order), device=result.sums.device)
    return AnswerLogps(result.sums[back], result.counts[back], result.num_tokens, result.num_slots)


def pair_logps(model: Any, chunk: list[PairExample], run: Run) -> AnswerLogps:
    """Both answers of every pair in one forward pass: chosen_0, rejected_0, chosen_1, ..."""
    return sequence_logps(model, [side for pair in chunk for side in (pair.chosen, pair.rejected)], run)


def reference_logps(run: Run, examples: list[Any], *, source: tuple[str, str], what: str,
                    scores: Callable[[Any, list[Any]], torch.Tensor], width: int) -> np.ndarray:
    """`(len(examples), width)` reference log-probabilities: `scores(model, chunk)` with the
    adapter off, row `example.index` for each example; cached in the store beside the data file
    (`source` = (file key, base model SHA); `what` tells apart what different methods score)."""
    file_key, base_sha = source
    tag = "" if what == "pairs" else f"|{what}"
    ident = hashlib.sha256(f"{REFERENCE_FORMAT_VERSION}|{base_sha}|{run.spec.hyperparameters.max_seq_length}{tag}"
                           .encode()).hexdigest()[:24]
    key = layout.reference_logps_key(file_key, ident)
    if run.store.exists(key):
        cached = np.load(io.BytesIO(run.store.get_bytes(key)))
        if cached.shape == (len(examples), width):
            return cached
    model = run.model
    adapter = hasattr(model, "disable_adapter")
    if not adapter and run.state.step > 0:  # a full fine-tune can only score the reference before it moves
        raise RuntimeError(f"the reference log-probabilities at {key} are gone and the weights have been "
                           "trained since: they cannot be recomputed")
    values = np.zeros((len(examples), width), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), (model.disable_adapter() if adapter else contextlib.nullcontext()):
            for chunk in example_chunks(examples, run.spec.hyperparameters):
                rows = scores(model, chunk).detach().to("cpu", torch.float64).reshape(len(chunk), width)
                for n, example in enumerate(chunk):
                    values[example.index] = rows[n].numpy()
    finally:
        model.train(was_training)
    buffer = io.BytesIO()
    np.save(buffer, values)
    if run.dist.main:  # every rank computed the same values; one writes them
        run.store.put_bytes(key, buffer.getvalue())
    log.info("reference log-probabilities of %d examples computed (adapter off), kept at %s", len(examples), key)
    return values


def log_odds(mean_logp: torch.Tensor) -> torch.Tensor:
    """log(p / (1 - p)) for p = exp(mean_logp) < 1, computed without cancelling."""
    return mean_logp - torch.log1p(-torch.exp(mean_logp.clamp(max=-1e-6)))


class PairObjective:
    """An objective on (chosen, rejected) pairs (`Objective` protocol): both answers of a
    micro-batch's pairs go through the model in one forward pass, and `loss(logps, reference)`
    turns their log-probabilities — and, with `reference=True`, the reference model's, one
    (chosen, rejected) row per pair — into per-pair losses and whether each pair prefers its
    chosen answer. The step's loss is the mean over its pairs."""

    def __init__(self, name: str, loss: Callable[[AnswerLogps, torch.Tensor | None],
                                                 tuple[torch.Tensor, torch.Tensor]], *, reference: bool) -> None:
        self.name, self.loss, self.uses_reference = name, loss, reference
        self.sources: dict[str, tuple[str, str]] = {}  # split -> (file key, base model sha)
        self.reference: dict[str, np.ndarray] = {}  # split -> (pairs, 2) reference log-probs

    def load(self, store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[PairExample]:
        self.sources[label] = (ref.key, base_model_sha256)
        return load_pairs(store, ref, tokenizer, hp, label=label)

    def prepare(self, run: Run) -> None:
        if not self.uses_reference:
            return
        for examples in (run.train_set, run.valid_set):
            if examples:
                split = examples[0].split
                self.reference[split] = reference_logps(
                    run, examples, source=self.sources[split], what="pairs", width=2,
                    scores=lambda model, chunk: pair_logps(model, chunk, run).sums)

    def units(self, examples: list[Any]) -> int:
        return len(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        return example_chunks(examples, hp)

    def forward(self, run: Run, chunk: list[PairExample]) -> Any:
        from tuneforge.train.objective import Scores

        logps = pair_logps(run.model, chunk, run)
        reference = None
        if self.uses_reference:
            rows = self.reference[chunk[0].split][[pair.index for pair in chunk]]
            reference = torch.tensor(rows, dtype=logps.sums.dtype, device=logps.sums.device)
        losses, preferred = self.loss(logps, reference)
        return Scores(losses.sum(), int(preferred.sum()), len(chunk), logps.num_tokens, logps.num_slots)
