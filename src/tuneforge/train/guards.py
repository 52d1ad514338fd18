"""The divergence guard: a loss that is no longer finite, or a smoothed loss that
stays far above its lowest value, stops the job (`training_diverged`)."""

from __future__ import annotations

from tuneforge.train.errors import TrainingDiverged
from tuneforge.train.run import Run, StepStats

LOSS_SMOOTHING = 0.9  # the guard watches an exponential moving average: one hard batch is not divergence
LOSS_WINDOW_STEPS = 10  # about 1 / (1 - LOSS_SMOOTHING): the steps the average mostly spans


def check_divergence(run: Run, stats: StepStats) -> TrainingDiverged | None:
    """Count steps whose smoothed loss is far above its best (by `divergence_loss_multiple` and by at
    least `divergence_min_increase` nats); too many in a row is divergence (returned, raised by the caller)."""
    state, spec = run.state, run.spec
    ema = stats.train_loss if state.loss_ema is None else \
        LOSS_SMOOTHING * state.loss_ema + (1 - LOSS_SMOOTHING) * stats.train_loss
    state.loss_ema = ema
    # the lowest value counts from the step where the average spans a whole window, so that a
    # first batch of easy examples (data the base model already knows) cannot set it
    if state.step >= LOSS_WINDOW_STEPS and (state.best_loss is None or ema < state.best_loss):
        state.best_loss = ema
    far_above = state.best_loss is not None and ema > spec.divergence_loss_multiple * state.best_loss and \
        ema - state.best_loss > spec.divergence_min_increase
    state.bad_steps = state.bad_steps + 1 if far_above else 0
    if spec.divergence_patience_steps > 0 and state.bad_steps >= spec.divergence_patience_steps:
        return TrainingDiverged(
            state.step, f"the smoothed loss stayed above {spec.divergence_loss_multiple:g}x its lowest value "
            f"({state.best_loss:.4f}) for {state.bad_steps} steps (now {ema:.4f})",
            learning_rate=stats.learning_rate)
    return None
