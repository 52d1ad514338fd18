"""Supervised fine-tuning (`supervised`): next-token cross-entropy on the assistant turns.

Data: OpenAI chat lines `{messages, tools?}` (the chat template renders them;
assistant turns are targets unless `weight: 0`, everything else context unless
`train_on_inputs`) or `{prompt, completion}` lines. The loss is the mean over
the target tokens of a step; the accuracy is the share of target tokens
predicted exactly (argmax). Examples are packed into rows of
`max_seq_length` tokens; attention never crosses from one into the next.
"""

from __future__ import annotations

from tuneforge.methods import NoOptions
from tuneforge.train.objective import TokenObjective, load_token_examples


def build(options: NoOptions) -> TokenObjective:
    return TokenObjective("supervised", load_token_examples)

