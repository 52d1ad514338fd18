"""The platform's vocabularies, each defined once: a `Literal` type and the tuple of its values.

Everything else derives from these (pydantic fields use the `Literal`, checks and
messages the tuple), so that adding a tier or a format is one line here, and a
place that lists them by hand is a bug. Job and attempt statuses live with their
transition table in `domain/status.py`.
"""

from __future__ import annotations

from typing import Literal, get_args

Tier = Literal["free", "standard", "premium"]
TIERS: tuple[str, ...] = get_args(Tier)

TrainingTypeName = Literal["lora", "qlora", "full"]
TRAINING_TYPES: tuple[str, ...] = get_args(TrainingTypeName)

DataFormat = Literal["jsonl", "csv", "parquet", "hf_dataset"]
DATA_FORMATS: tuple[str, ...] = get_args(DataFormat)

Strategy = Literal["ddp", "fsdp"]  # how several GPUs share a job
STRATEGIES: tuple[str, ...] = get_args(Strategy)
