"""Direct preference optimisation (`dpo`) on (prompt, chosen, rejected) pairs.

Data: OpenAI's DPO lines `{input: {messages, tools?}, preferred_output:
[assistant message], non_preferred_output: [assistant message]}` (pairs given
as `{prompt, chosen, rejected}` are normalised into that shape at validation).

With `r = beta * (log pi(answer) - log ref(answer))` for each side, the loss of
a pair is -log sigmoid(r_chosen - r_rejected). The reference is the base model:
its log-probabilities are computed once, with the adapter off, and cached
beside the data (`train/pairs.py`). Both sides of a micro-batch's pairs go
through the model in one packed forward pass. The step's loss is the mean
over its pairs; the accuracy is the share of pairs whose chosen answer gets
the larger reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from pydantic import Field

from tuneforge.domain.job_config import Auto, SupervisedHyperparameters
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.train.methods import EvalDefaults, TrainingMethod
from tuneforge.train.objective import Scores


class DpoHyperparameters(SupervisedHyperparameters):
    beta: Union[float, Auto] = Field("auto", description="Strength of the pull towards the reference (base) "
                                                         "model: larger keeps the fine-tune closer to it.")


class DpoObjective:
    name = "dpo"

    def __init__(self, beta: float) -> None:
        self.beta = beta
        self.sources: dict[str, tuple[str, str]] = {}  # split -> (file key, base model sha)
        self.reference: dict[str, Any] = {}  # split -> (pairs, 2) reference log-probs

    def load(self, store: Any, ref: DataFileRef, tokenizer: Any, hp: Hyperparameters, *, label: str,
             base_model_sha256: str) -> list[Any]:
        from tuneforge.train import pairs

        self.sources[label] = (ref.key, base_model_sha256)
        return pairs.load_pairs(store, ref, tokenizer, hp, label=label)

    def prepare(self, run: Any) -> None:
        from tuneforge.train import pairs

        for examples in (run.train_set, run.valid_set):
            if examples:
                split = examples[0].split
                self.reference[split] = pairs.reference_logps(
                    run, examples, source=self.sources[split], what="pairs", width=2,
                    scores=lambda model, chunk: pairs.pair_logps(model, chunk, run).sums)

    def units(self, examples: list[Any]) -> int:
        return len(examples)

    def chunks(self, examples: list[Any], hp: Hyperparameters) -> list[list[Any]]:
        from tuneforge.train import pairs

        return pairs.example_chunks(examples, hp)

    def forward(self, run: Any, chunk: list[Any]) -> Scores:
        import torch
        import torch.nn.functional as F

        from tuneforge.train import pairs

        logps = pairs.pair_logps(run.model, chunk, run)
        chosen, rejected = logps.sums[0::2], logps.sums[1::2]
        reference = self.reference[chunk[0].split][[pair.index for pair in chunk]]
        ref = torch.tensor(reference, dtype=chosen.dtype, device=chosen.device)
        margin = self.beta * ((chosen - ref[:, 0]) - (rejected - ref[:, 1]))
        losses = -F.logsigmoid(margin)
        return Scores(losses.sum(), int((margin > 0).sum()), len(chunk), logps.num_tokens, logps.num_slots)


def _objective(options: Mapping[str, Any]) -> DpoObjective:
    return DpoObjective(float(options["beta"]))


METHOD = TrainingMethod(
    name="dpo",
    summary="direct preference optimisation on chosen/rejected pairs",
    hyperparameters=DpoHyperparameters,
    data_kinds=("preference",),
    learning_rate={"lora": 5e-5, "qlora": 5e-5, "full": 5e-7},
    objective=_objective,
    option_defaults={"beta": 0.1},
    option_ranges={"beta": (1e-4, 100.0)},
    sequences_per_example=2,
    default_eval=EvalDefaults(perplexity=False),
)
