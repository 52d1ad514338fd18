"""Resolve "auto" hyperparameters into concrete values a trainer can run.

Rules (shown on the job once resolved):
- n_epochs: 3, raised for tiny datasets so the run sees >= 100 examples
  (at most 25 epochs), lowered for large ones to ~25,000 examples seen.
- batch_size: about 0.2% of the examples, a power of two within [1, 32].
- learning_rate: the method's default for the training type (`tuneforge.methods`),
  times the multiplier; the method's own options (e.g. beta) from its defaults.
- micro-batch: at most 8 examples; gradient accumulation makes up the rest.
- LoRA rank 8 (alpha = 2 x rank); max_seq_length = min(model limit, 2048).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tuneforge import methods
from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import JobRequest, SupervisedHyperparameters, TrainingType
from tuneforge.domain.spec import Hyperparameters, LoraConfig
from tuneforge.methods import param_prefix

MAX_MICRO_BATCH = 8
DEFAULT_MAX_SEQ_LENGTH = 2048


def requested_hyperparameters(request: JobRequest) -> SupervisedHyperparameters:
    """The method's typed hyperparameters ("auto" where not given); a 400 naming the field
    (`method.<type>.hyperparameters.<name>`) if they do not fit the method's model."""
    return methods.get(request.method_type).parse_hyperparameters(request.asked_hyperparameters)


def _auto(value, default):  # noqa: ANN001
    return default if value in ("auto", None) else value


def _check_range(name: str, value: float, low: float, high: float, prefix: str) -> None:
    if not (low <= value <= high):
        raise invalid(f"{prefix}.{name} must be between {low} and {high}; got {value}", param=f"{prefix}.{name}")


def _auto_epochs(num_examples: int) -> int:
    if num_examples * 3 < 100:
        return min(25, math.ceil(100 / num_examples))
    if num_examples * 3 > 25_000:
        return max(1, 25_000 // num_examples)
    return 3


def _auto_batch_size(num_examples: int) -> int:
    target = max(1.0, num_examples * 0.002)
    return int(min(32, 2 ** round(math.log2(target))))


_RANGES = {
    "n_epochs": (1, 50),
    "batch_size": (1, 256),
    "learning_rate_multiplier": (1e-3, 100.0),
    "learning_rate": (1e-8, 1.0),
    "warmup_ratio": (0.0, 0.5),
    "weight_decay": (0.0, 1.0),
    "max_grad_norm": (0.0, 1e4),
    "max_seq_length": (16, 1 << 20),
    "gradient_accumulation_steps": (1, 256),
}


def check_static(hp: SupervisedHyperparameters, method: str = "supervised") -> None:
    """Range checks that need no dataset, run at job creation (the method's own options too)."""
    methods.get(method).resolve_options(hp)
    prefix = param_prefix(method)
    for name, (low, high) in _RANGES.items():
        value = getattr(hp, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            _check_range(name, value, low, high, prefix)
    if isinstance(hp.batch_size, int) and isinstance(hp.gradient_accumulation_steps, int):
        if hp.batch_size % hp.gradient_accumulation_steps:
            raise invalid(
                f"{prefix}.batch_size ({hp.batch_size}) must be a multiple of "
                f"gradient_accumulation_steps ({hp.gradient_accumulation_steps})",
                param=f"{prefix}.gradient_accumulation_steps",
            )


def resolve_max_seq_length(hp: SupervisedHyperparameters, model_max_positions: int | None,
                           method: str = "supervised") -> int:
    limit = model_max_positions or DEFAULT_MAX_SEQ_LENGTH
    max_seq_length = int(_auto(hp.max_seq_length, min(limit, DEFAULT_MAX_SEQ_LENGTH)))
    if max_seq_length > limit:
        raise invalid(
            f"{param_prefix(method)}.max_seq_length {max_seq_length} exceeds the model's limit of {limit} tokens",
            param=f"{param_prefix(method)}.max_seq_length",
        )
    return max_seq_length


def resolve(
    hp: SupervisedHyperparameters,
    training_type: TrainingType,
    *,
    num_examples: int,
    model_max_positions: int | None,
    method: str = "supervised",
    micro_batch_for: Callable[[int, int], tuple[int, int]] | None = None,
) -> Hyperparameters:
    """`micro_batch_for(batch_size, max_seq_length) -> (micro, accumulation)`: how the
    "auto" micro-batch is chosen (the planner passes the memory model's choice);
    without it, the largest divisor of the batch size up to MAX_MICRO_BATCH."""
    n_epochs = int(_auto(hp.n_epochs, _auto_epochs(num_examples)))
    batch_size = int(_auto(hp.batch_size, _auto_batch_size(num_examples)))
    batch_size = max(1, min(batch_size, num_examples))
    training_method = methods.get(method)
    base_lr = training_method.learning_rate[training_type.type]
    multiplier = float(_auto(hp.learning_rate_multiplier, 1.0))
    if hp.learning_rate not in ("auto", None):
        learning_rate = float(hp.learning_rate)
        multiplier = learning_rate / base_lr
    else:
        learning_rate = base_lr * multiplier
    max_seq_length = resolve_max_seq_length(hp, model_max_positions, method)
    if hp.gradient_accumulation_steps not in ("auto", None):
        accumulation = int(hp.gradient_accumulation_steps)
        micro = max(1, batch_size // accumulation)
    elif micro_batch_for is not None:
        micro, accumulation = micro_batch_for(batch_size, max_seq_length)
    else:
        micro = max(m for m in range(1, min(batch_size, MAX_MICRO_BATCH) + 1) if batch_size % m == 0)
        accumulation = batch_size // micro
    return Hyperparameters(
        n_epochs=n_epochs,
        batch_size=micro * accumulation,
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        learning_rate=learning_rate,
        learning_rate_multiplier=round(multiplier, 6),
        warmup_ratio=float(_auto(hp.warmup_ratio, 0.03)),
        lr_scheduler_type=str(_auto(hp.lr_scheduler_type, "linear")),
        weight_decay=float(_auto(hp.weight_decay, 0.0)),
        max_grad_norm=float(_auto(hp.max_grad_norm, 1.0)),
        max_seq_length=max_seq_length,
        train_on_inputs=bool(_auto(hp.train_on_inputs, False)),
        packing=bool(_auto(hp.packing, True)),
        method_options=training_method.resolve_options(hp).model_dump(),
    )


def default_lora_rank(num_parameters: int | None) -> int:
    """Bigger models get more adapter capacity: 8 below 1B parameters, 16 up to 15B,
    32 up to 40B, 64 above (alpha follows as 2 x rank)."""
    size = num_parameters or 0
    for limit, rank in ((1e9, 8), (15e9, 16), (40e9, 32)):
        if size < limit:
            return rank
    return 64


def resolve_lora(training_type: TrainingType, num_parameters: int | None = None) -> LoraConfig:
    rank = int(_auto(training_type.rank, default_lora_rank(num_parameters)))
    if not 1 <= rank <= 1024:
        raise invalid("training_type.rank must be between 1 and 1024", param="training_type.rank")
    alpha = float(_auto(training_type.alpha, 2 * rank))
    return LoraConfig(
        rank=rank, alpha=int(alpha) if alpha == int(alpha) else alpha,
        dropout=training_type.dropout, target_modules=training_type.target_modules,
    )
