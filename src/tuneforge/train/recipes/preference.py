"""Preference optimisation: DPO and ORPO on (prompt, chosen, rejected) pairs.

Data: the prepared dataset holds OpenAI's DPO shape, `{input: {messages,
tools?}, preferred_output: [assistant message], non_preferred_output:
[assistant message]}` (pairs given as `{prompt, chosen, rejected}` were
normalised into it at validation). Each side is the prompt conversation plus
that answer, tokenized with the model's chat template; only the answer's
tokens (its end-of-turn markup included) count. Assistant turns inside the
prompt are context, never targets.

A pair's *log-probability* on a side is the sum of the log-probabilities of
its answer tokens.

- **DPO** (`beta`, default 0.1): with `r = beta * (log pi(answer) - log
  ref(answer))`, loss = -log sigmoid(r_chosen - r_rejected). The reference is
  the base model. Its log-probabilities are computed once per dataset before
  training — with the adapter switched off, so no second model is held — and
  kept in the object store beside the prepared dataset (keyed by base model
  and max_seq_length): later attempts and later jobs on the same data read
  them instead of recomputing.
- **ORPO** (`beta`, the weight of the odds-ratio term, default 0.1): no
  reference. With `m` the mean per-token log-probability of an answer and
  odds(m) = m - log(1 - exp(m)), loss = -m_chosen + beta * -log sigmoid(
  odds(m_chosen) - odds(m_rejected)): supervised learning of the chosen
  answer plus a push away from the rejected one.

Both sides of a micro-batch's pairs go through the model in one forward pass
(packed rows, like supervised training). The step's loss is the mean over its
pairs; the reported accuracy is the share of pairs whose chosen answer the
model prefers (DPO: a larger reward; ORPO: a larger mean log-probability).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tuneforge.data.errors import BadDataError
from tuneforge.data.reader import iter_jsonl
from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample, tokenize_chat
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.storage.store import ObjectStore
from tuneforge.train.batches import collate, collate_packed, pack
from tuneforge.train.recipes.sft import Objective, Run, Scores

log = logging.getLogger(__name__)

REFERENCE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class PairExample:
    chosen: TokenizedExample
    rejected: TokenizedExample
    index: int  # position in its file: where its reference log-probabilities are kept
    split: str  # "training" or "validation"


def tokenize_pair(record: dict[str, Any], tokenizer: Any, *, max_seq_length: int) -> tuple[TokenizedExample, ...]:
    prompt = record.get("input") or {}
    messages = prompt.get("messages") if isinstance(prompt, dict) else None
    if not isinstance(messages, list) or not messages:
        raise BadDataError("invalid_example", "'input.messages' must be a non-empty list", param="input.messages")
    context = [{**message, "weight": 0} if message.get("role") == "assistant" else message for message in messages]
    sides = []
    for key in ("preferred_output", "non_preferred_output"):
        answer = record.get(key)
        if not isinstance(answer, list) or len(answer) != 1 or not isinstance(answer[0], dict):
            raise BadDataError("invalid_example", f"'{key}' must hold one assistant message", param=key)
        turn = {**answer[0], "role": "assistant", "weight": 1}
        side = tokenize_chat(context + [turn], tokenizer, max_seq_length=max_seq_length)
        if side.num_loss_tokens == 0:
            raise BadDataError(
                "example_too_long", f"the prompt fills max_seq_length ({max_seq_length}) and leaves no room "
                f"for '{key}'", param=key)
        sides.append(side)
    return tuple(sides)


def load_pairs(store: ObjectStore, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *,
               label: str) -> list[PairExample]:
    pairs: list[PairExample] = []
    line_number = 0
    try:
        with store.open_read(ref.key) as stream:
            for line_number, record in iter_jsonl(stream):
                chosen, rejected = tokenize_pair(record, tokenizer, max_seq_length=hp.max_seq_length)
                pairs.append(PairExample(chosen, rejected, len(pairs), label))
    except BadDataError as exc:
        raise BadDataError(exc.code, f"{label} file: {exc.detail}",
                           line_number=exc.line_number or line_number, param=exc.param) from None
    if not pairs:
        raise BadDataError("empty_file", f"the {label} file has no examples")
    return pairs


@dataclass(frozen=True)
class AnswerLogps:
    sums: torch.Tensor  # summed answer-token log-probabilities, one per sequence, in row order
    counts: torch.Tensor  # answer tokens per sequence (at least 1)
    num_tokens: int
    num_slots: int


def answer_logps(model: Any, rows: list[list[TokenizedExample]], run: Run) -> AnswerLogps:
    """Log-probabilities of the answers of every sequence in `rows` (rows of packed
    sequences, or one sequence per row without packing)."""
    if run.spec.hyperparameters.packing:
        varlen = getattr(run.model.config, "_attn_implementation", "") == "flash_attention_2"
        batch = collate_packed(rows, run.tokenizer.pad_token_id, run.device, block_mask=not varlen)
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                  "position_ids": batch.position_ids}
    else:
        batch = collate([row[0] for row in rows], run.tokenizer.pad_token_id, run.device)
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
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


class PreferenceObjective(Objective):
    def __init__(self, method: str) -> None:
        if method not in ("dpo", "orpo"):
            raise ValueError(method)
        self.name = method
        self.sources: dict[str, tuple[str, str]] = {}  # split -> (file key, base model sha)
        self.reference: dict[str, np.ndarray] = {}  # split -> (pairs, 2) reference log-probs (DPO)

    # -- data ----------------------------------------------------------------
    def load(self, run_store: ObjectStore, ref: Any, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[Any]:
        self.sources[label] = (ref.key, base_model_sha256)
        return load_pairs(run_store, ref, tokenizer, hp, label=label)

    def units(self, examples: list[Any]) -> int:
        return len(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        size = max(1, hp.micro_batch_size)
        return [examples[start:start + size] for start in range(0, len(examples), size)]

    # -- reference log-probabilities (DPO) ------------------------------------
    def prepare(self, run: Run) -> None:
        if self.name == "dpo":
            for pairs in (run.train_set, run.valid_set):
                if pairs:
                    self.reference[pairs[0].split] = self._reference_for(run, pairs)

    def _reference_for(self, run: Run, pairs: list[PairExample]) -> np.ndarray:
        file_key, base_sha = self.sources[pairs[0].split]
        ident = hashlib.sha256(f"{REFERENCE_FORMAT_VERSION}|{base_sha}|{run.spec.hyperparameters.max_seq_length}"
                               .encode()).hexdigest()[:24]
        key = f"{file_key}.reference-logps-{ident}.npy"
        if run.store.exists(key):
            cached = np.load(io.BytesIO(run.store.get_bytes(key)))
            if cached.shape == (len(pairs), 2):
                return cached
        model = run.model
        adapter = hasattr(model, "disable_adapter")
        if not adapter and run.state.step > 0:  # a full fine-tune can only score the reference before it moves
            raise RuntimeError(f"the reference log-probabilities at {key} are gone and the weights have been "
                               "trained since: they cannot be recomputed")
        values = np.zeros((len(pairs), 2), dtype=np.float64)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), (model.disable_adapter() if adapter else contextlib.nullcontext()):
                for chunk in self.chunks(pairs, run.spec.hyperparameters):
                    logps = self._logps(model, chunk, run).sums
                    for n, pair in enumerate(chunk):
                        values[pair.index] = (float(logps[2 * n]), float(logps[2 * n + 1]))
        finally:
            model.train(was_training)
        buffer = io.BytesIO()
        np.save(buffer, values)
        if run.dist.main:  # every rank computed the same values; one writes them
            run.store.put_bytes(key, buffer.getvalue())
        log.info("reference log-probabilities of %d pairs computed (adapter off), kept at %s", len(pairs), key)
        return values

    # -- one forward pass ------------------------------------------------------
    def _logps(self, model: Any, chunk: list[PairExample], run: Run) -> AnswerLogps:
        """Both answers of every pair in one forward pass; results in the order
        chosen_0, rejected_0, chosen_1, ..."""
        sequences = [side for pair in chunk for side in (pair.chosen, pair.rejected)]
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

    def forward(self, run: Run, chunk: list[Any]) -> Scores:
        logps = self._logps(run.model, chunk, run)
        chosen, rejected = logps.sums[0::2], logps.sums[1::2]
        beta = run.spec.hyperparameters.beta
        if self.name == "dpo":
            reference = self.reference[chunk[0].split][[pair.index for pair in chunk]]
            ref = torch.tensor(reference, dtype=chosen.dtype, device=chosen.device)
            margin = beta * ((chosen - ref[:, 0]) - (rejected - ref[:, 1]))
            losses = -F.logsigmoid(margin)
            preferred = margin > 0
        else:  # orpo
            mean_chosen, mean_rejected = chosen / logps.counts[0::2], rejected / logps.counts[1::2]
            log_odds = _log_odds(mean_chosen) - _log_odds(mean_rejected)
            losses = -mean_chosen - beta * F.logsigmoid(log_odds)
            preferred = log_odds > 0
        return Scores(losses.sum(), int(preferred.sum()), len(chunk), logps.num_tokens, logps.num_slots)


def _log_odds(mean_logp: torch.Tensor) -> torch.Tensor:
    """log(p / (1 - p)) for p = exp(mean_logp) < 1, computed without cancelling."""
    return mean_logp - torch.log1p(-torch.exp(mean_logp.clamp(max=-1e-6)))
