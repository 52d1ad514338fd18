"""Simple preference optimisation (`simpo`) on (prompt, chosen, rejected) pairs.

Data: as DPO's (`methods/dpo.py`). No reference model: the implied reward of
an answer is its length-normalised log-probability, r = beta * log pi(y|x) /
|y| (|y| its answer tokens), and the loss of a pair is
-log sigmoid(r_chosen - r_rejected - gamma), with gamma a target margin
(Meng et al., 2024). Both answers go through the model in one packed forward
pass. The accuracy is the share of pairs whose chosen answer has the larger
reward.
"""

from __future__ import annotations

from typing import Any

from tuneforge.methods.simpo import SimpoOptions
from tuneforge.train.pairs import PairObjective


def build(options: SimpoOptions) -> Any:
    beta, gamma = options.beta, options.gamma

    def loss(logps: Any, reference: Any) -> tuple[Any, Any]:
        import torch.nn.functional as F

        rewards = beta * logps.sums / logps.counts
        margin = rewards[0::2] - rewards[1::2]
        return -F.logsigmoid(margin - gamma), margin > 0

    return PairObjective("simpo", loss, reference=False)

