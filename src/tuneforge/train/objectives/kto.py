"""Kahneman-Tversky optimisation (`kto`) on unpaired, labelled completions.

Data: one completion per line, marked desirable or not —
`{"input": {"messages": [...], "tools"?}, "output": [assistant message],
"label": true|false}` (true = desirable), or `{"prompt", "completion",
"label"}` with strings (a prompt may also be a list of messages). A missing
or non-boolean `label` is refused with its line.

Loss (Ethayarajh et al., 2024). With r = log pi(y|x) - log ref(y|x) the
implied reward of a completion (the reference is the base model, scored once
with the adapter off and cached beside the data, as DPO's), and z0 the
reference point:

    desirable:    desirable_weight   * (1 - sigmoid(beta * (r - z0)))
    undesirable:  undesirable_weight * (1 - sigmoid(beta * (z0 - r)))

z0 estimates KL(pi || ref) as KTO specifies: on mismatched pairs — each
prompt with the completion of another example (the next line of the file,
wrapping) — z0 = max(0, mean(log pi(y'|x) - log ref(y'|x))) over the
micro-batch, with no gradient through it. The mismatched pairing is fixed per
file, so its reference log-probabilities are computed once with the others.
The step's loss is the mean over its completions; the accuracy is the share
whose reward falls on the side of z0 its label asks for.

The paper advises weights such that desirable_weight * n_desirable /
(undesirable_weight * n_undesirable) lies in [1, 4/3]; both default to 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneforge.data.errors import BadDataError
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.methods.kto import KtoOptions
from tuneforge.train import pairs
from tuneforge.train.objective import Scores

# --- objective --------------------------------------------------------------------------


@dataclass(frozen=True)
class KtoExample:
    completion: Any  # TokenizedExample: the prompt and its own completion
    mismatched: Any  # TokenizedExample: the prompt and the next example's completion (for z0)
    desirable: bool
    index: int  # position in its file: where its reference log-probabilities are kept
    split: str


def load_completions(store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *,
                     label: str) -> list[KtoExample]:
    records = list(pairs.read_records(store, ref, label=label))
    if not records:
        raise BadDataError("empty_file", f"the {label} file has no examples")
    examples: list[KtoExample] = []
    try:
        for n, (line, record) in enumerate(records):
            other = records[(n + 1) % len(records)][1]
            if type(record.get("label")) is not bool:
                raise BadDataError("invalid_label", "'label' must be true or false", param="label", line_number=line)
            context = pairs.prompt_context(record)
            tools = pairs.prompt_tools(record)
            own = pairs.answer_sequence(context, record.get("output"), "output", tokenizer,
                                        max_seq_length=hp.max_seq_length, tools=tools)
            mismatched = pairs.answer_sequence(context, other.get("output"), "output", tokenizer,
                                               max_seq_length=hp.max_seq_length, tools=tools)
            examples.append(KtoExample(own, mismatched, record["label"], n, label))
    except BadDataError as exc:
        raise BadDataError(exc.code, f"{label} file: {exc.detail}", line_number=exc.line_number or line,
                           param=exc.param) from None
    return examples


class KtoObjective:
    name = "kto"

    def __init__(self, beta: float, desirable_weight: float, undesirable_weight: float) -> None:
        self.beta, self.desirable_weight, self.undesirable_weight = beta, desirable_weight, undesirable_weight
        self.sources: dict[str, tuple[str, str]] = {}  # split -> (file key, base model sha)
        self.reference: dict[str, Any] = {}  # split -> (examples, 2): own completion, mismatched completion

    def load(self, store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[Any]:
        self.sources[label] = (ref.key, base_model_sha256)
        return load_completions(store, ref, tokenizer, hp, label=label)

    def prepare(self, run: Any) -> None:
        for examples in (run.train_set, run.valid_set):
            if examples:
                split = examples[0].split
                self.reference[split] = pairs.reference_logps(
                    run, examples, source=self.sources[split], what="kto", width=2,
                    scores=lambda model, chunk: pairs.sequence_logps(
                        model, [s for e in chunk for s in (e.completion, e.mismatched)], run).sums)

    def units(self, examples: list[Any]) -> int:
        return len(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        return pairs.example_chunks(examples, hp)

    def forward(self, run: Any, chunk: list[Any]) -> Scores:
        import torch

        logps = pairs.sequence_logps(run.model, [example.completion for example in chunk], run)
        reference = self.reference[chunk[0].split][[example.index for example in chunk]]
        ref = torch.tensor(reference, dtype=logps.sums.dtype, device=logps.sums.device)
        with torch.no_grad():  # the reference point carries no gradient
            mismatched = pairs.sequence_logps(run.model, [example.mismatched for example in chunk], run).sums
            z0 = (mismatched - ref[:, 1]).mean().clamp(min=0)
        rewards = logps.sums - ref[:, 0]
        desirable = torch.tensor([example.desirable for example in chunk], device=rewards.device)
        losses = torch.where(
            desirable,
            self.desirable_weight * (1 - torch.sigmoid(self.beta * (rewards - z0))),
            self.undesirable_weight * (1 - torch.sigmoid(self.beta * (z0 - rewards))),
        )
        correct = int(((rewards > z0) == desirable).sum())
        return Scores(losses.sum(), correct, len(chunk), logps.num_tokens, logps.num_slots)


def build(options: KtoOptions) -> KtoObjective:
    return KtoObjective(options.beta, options.desirable_weight, options.undesirable_weight)

