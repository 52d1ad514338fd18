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

from typing import Any

from tuneforge.methods.dpo import DpoOptions
from tuneforge.train.pairs import PairObjective


def build(options: DpoOptions) -> Any:
    beta = options.beta

    def loss(logps: Any, reference: Any) -> tuple[Any, Any]:
        import torch.nn.functional as F

        chosen, rejected = logps.sums[0::2], logps.sums[1::2]
        margin = beta * ((chosen - reference[:, 0]) - (rejected - reference[:, 1]))
        return -F.logsigmoid(margin), margin > 0

    return PairObjective("dpo", loss, reference=True)

