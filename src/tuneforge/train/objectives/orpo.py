"""Odds-ratio preference optimisation (`orpo`) on (prompt, chosen, rejected) pairs.

Data: as DPO's (`methods/dpo.py`). No reference model. With `m` the mean
per-token log-probability of an answer and odds(m) = m - log(1 - exp(m)),
the loss of a pair is -m_chosen + beta * -log sigmoid(odds(m_chosen) -
odds(m_rejected)): supervised learning of the chosen answer plus a push away
from the rejected one. The accuracy is the share of pairs whose chosen answer
has the larger mean log-probability.
"""

from __future__ import annotations

from typing import Any

from tuneforge.methods.orpo import OrpoOptions
from tuneforge.train.pairs import PairObjective, log_odds


def build(options: OrpoOptions) -> Any:
    beta = options.beta

    def loss(logps: Any, reference: Any) -> tuple[Any, Any]:
        import torch.nn.functional as F

        mean_chosen = logps.sums[0::2] / logps.counts[0::2]
        mean_rejected = logps.sums[1::2] / logps.counts[1::2]
        odds = log_odds(mean_chosen) - log_odds(mean_rejected)
        return -mean_chosen - beta * F.logsigmoid(odds), odds > 0

    return PairObjective("orpo", loss, reference=False)

