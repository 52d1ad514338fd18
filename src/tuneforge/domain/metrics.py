"""Per-step metrics: one history row per optimizer step in the trainer state,
one `metrics` event per step for the API.

The row is what a checkpoint keeps (`trainer_state.json`, key `history`); the
event data is built from the row alone, so the control plane can rebuild the
metrics of steps whose reports were lost (a trainer killed while its reports
waited for the control plane) from the checkpoint a later attempt resumed from.

An objective may report figures of its own (`Scores.metrics`, train/objective.py):
the row keeps them apart, under `OBJECTIVE_METRICS_KEY`, so that they never
shadow the loop's own and nothing here needs their names; the event, the
checkpoint's metrics and the results file show them flat, by name, after the
loop's own figures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# Keys of a history row beyond the results-file columns (docs/trainer.md).
ROW_EXTRA_KEYS = (
    "learning_rate", "grad_norm", "tokens_per_second", "padding_fraction", "peak_memory_mb", "mfu",
    # what NVML says of the GPU (train/gpu_telemetry.py); absent without one
    "gpu_utilization", "gpu_memory_used_mb", "gpu_memory_peak_mb", "gpu_power_w", "gpu_temperature_c",
)
# Key of a history row holding the objective's own figures ({name: value}).
OBJECTIVE_METRICS_KEY = "objective_metrics"

# What an objective's figure may be called: a column header, a tracker's series and a JSON key as is
_METRIC_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
# names the loop's own figures use in a row, an event or a checkpoint's metrics
RESERVED_METRIC_NAMES = frozenset({
    "step", "total_steps", "steps", "train_loss", "train_accuracy", "train_mean_token_accuracy", "valid_loss",
    "valid_mean_token_accuracy", "full_valid_loss", "full_valid_mean_token_accuracy", "recovered_from_checkpoint",
    OBJECTIVE_METRICS_KEY, *ROW_EXTRA_KEYS,
})


def check_metric_names(names: Iterable[str]) -> None:
    """Refuse an objective's figure that could not be shown by its name, or that would take the
    place of one of the loop's own (a `ValueError`: a method's mistake, not the tenant's)."""
    for name in names:
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"an objective's metric name must match {_METRIC_NAME.pattern}; got {name!r}")
        if name in RESERVED_METRIC_NAMES:
            raise ValueError(f"an objective's metric must not be called {name!r}: the training loop reports it")


def objective_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The objective's own figures of the step in `row`, in the order the objective gave them."""
    return dict(row.get(OBJECTIVE_METRICS_KEY) or {})


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
    for name, value in objective_metrics(row).items():
        data.setdefault(name, value)  # (names are checked when reported: the loop's own always win)
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
        **{name: value for name, value in objective_metrics(row).items() if name not in RESERVED_METRIC_NAMES},
    }
