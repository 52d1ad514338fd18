"""Which checkpoints a job keeps: one rule, applied by the trainer to the object store and by the
control plane to the listing, so that every listed checkpoint can be downloaded.

By epoch (the default, OpenAI's way): the checkpoints at the ends of the newest `keep_last`
epochs, plus the newest checkpoint of all (what a restart resumes from, mid-epoch perhaps).
Otherwise: the newest `keep_last` checkpoints. `keep_last` 0 keeps everything.
"""

from __future__ import annotations

from collections.abc import Iterable


def kept_steps(checkpoints: Iterable[tuple[int, bool]], keep_last: int, by_epoch: bool) -> set[int]:
    """`checkpoints`: (step, whether it ends an epoch) of every checkpoint; the steps kept."""
    ordered = sorted(checkpoints, reverse=True)
    if keep_last <= 0:
        return {step for step, _ in ordered}
    if not by_epoch:
        return {step for step, _ in ordered[:keep_last]}
    kept = {step for step, epoch_end in ordered if epoch_end}
    kept = set(sorted(kept, reverse=True)[:keep_last])
    if ordered:
        kept.add(ordered[0][0])
    return kept
