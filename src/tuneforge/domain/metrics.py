"""Per-step metrics: one history row per optimizer step in the trainer state,
one `metrics` event per step for the API.

The row is what a checkpoint keeps (`trainer_state.json`, key `history`); the
event data is built from the row alone, so the control plane can rebuild the
metrics of steps whose reports were lost (a trainer killed while its reports
waited for the control plane) from the checkpoint a later attempt resumed from.
"""

from __future__ import annotations

from typing import Any

# Keys of a history row beyond the results-file columns (docs/trainer.md).
ROW_EXTRA_KEYS = (
    "learning_rate", "grad_norm", "tokens_per_second", "padding_fraction", "peak_memory_mb", "mfu",
)


def metrics_data(row: dict[str, Any], total_steps: int) -> dict[str, Any]:
    """The data of the `metrics` event of the step in `row`."""
    data: dict[str, Any] = {
        "step": int(row["step"]), "total_steps": int(total_steps),
        "train_loss": row.get("train_loss"), "train_mean_token_accuracy": row.get("train_accuracy"),
    }
    for key in ROW_EXTRA_KEYS:
        if row.get(key) is not None:
            data[key] = row[key]
    if row.get("valid_loss") is not None:
        data["valid_loss"] = row["valid_loss"]
        data["valid_mean_token_accuracy"] = row.get("valid_mean_token_accuracy")
    return data


def metrics_message(data: dict[str, Any]) -> str:
    """A `metrics` event's message in OpenAI's words: "Step 3/40: training loss=1.23" (", validation
    loss=1.45" on a step that validated); the exact figures are in the event's data."""
    message = f"Step {data.get('step')}/{data.get('total_steps')}"
    losses = [(name, data.get(key)) for name, key in (("training", "train_loss"), ("validation", "valid_loss"))
              if isinstance(data.get(key), (int, float))]
    if losses:
        message += ": " + ", ".join(f"{name} loss={value:.2f}" for name, value in losses)
    return message


def checkpoint_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint object shows under `metrics` (OpenAI's names)."""
    # a checkpoint's validation runs on the whole validation set: valid_* and full_valid_* agree
    return {
        "train_loss": row.get("train_loss"), "train_mean_token_accuracy": row.get("train_accuracy"),
        "valid_loss": row.get("valid_loss"), "valid_mean_token_accuracy": row.get("valid_mean_token_accuracy"),
        "full_valid_loss": row.get("valid_loss"),
        "full_valid_mean_token_accuracy": row.get("valid_mean_token_accuracy"),
    }
