"""The training methods, registered by name.

A method is one module in this package that defines `METHOD`, a
`TrainingMethod`: its name, its hyperparameters (a pydantic model whose field
descriptions are the documentation), the example kinds it trains on (and any
data shape of its own), its default learning rates, its objective (loss and
metrics, built lazily so the control plane never imports torch) and its
default eval. The API, data validation, estimates, the memory model and the
trainer all look a method up here by name; nothing else lists methods.

Adding a method: write `methods/NAME.py` defining `METHOD`, add "NAME" to
`_MODULES` below, then tests and docs (docs/methods.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from tuneforge.domain.errors import from_validation_errors, invalid
from tuneforge.domain.job_config import SupervisedHyperparameters

if TYPE_CHECKING:
    from tuneforge.data.shapes import Shape
    from tuneforge.train.objective import Objective

# The registration lines: one module per method, in the order the docs list them.
_MODULES = ("supervised", "dpo", "orpo", "cpt", "kto", "simpo")

# Fields every method shares (`domain.spec.Hyperparameters`); anything else a
# method's model declares is one of its own options (`Hyperparameters.method_options`).
COMMON_FIELDS = frozenset(SupervisedHyperparameters.model_fields)


@dataclass(frozen=True)
class EvalDefaults:
    """What the post-training eval runs for a job of this method unless its body says otherwise."""

    golden: bool = True  # the platform's general-ability set
    safety: bool = True  # the platform's harmful-prompt set
    perplexity: bool = True  # validation results include exp(loss): the loss is a per-token NLL


@dataclass(frozen=True)
class TrainingMethod:
    name: str
    summary: str  # one line, for the API docs and error messages
    hyperparameters: type[SupervisedHyperparameters]  # the `method.<name>.hyperparameters` block
    data_kinds: tuple[str, ...]  # example kinds (`data.example.Kind`, or a shape of its own) it trains on
    learning_rate: Mapping[str, float]  # default learning rate by training type (lora, qlora, full)
    objective: Callable[[Mapping[str, Any]], Objective]  # resolved method options -> objective (imports torch)
    option_defaults: Mapping[str, Any] = field(default_factory=dict)  # values of its own options when "auto"
    option_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # inclusive bounds
    sequences_per_example: int = 1  # sequences one example puts through the model (memory model)
    beta_pulls_to_reference: bool = False  # its `beta` keeps the policy near the reference (gate advice)
    default_eval: EvalDefaults = EvalDefaults()
    shapes: tuple[Shape, ...] = ()  # data shapes this method brings (recognised in every upload)

    def parse_hyperparameters(self, raw: Any) -> SupervisedHyperparameters:
        """The method's typed block; a 400 naming `method.<name>.hyperparameters.<field>` otherwise."""
        if isinstance(raw, self.hyperparameters):
            return raw
        if isinstance(raw, BaseModel):
            raw = raw.model_dump(exclude_unset=True)
        try:
            return self.hyperparameters.model_validate(raw or {})
        except ValidationError as exc:
            raise from_validation_errors(exc.errors(), ("method", self.name, "hyperparameters")) from None

    def resolve_options(self, requested: SupervisedHyperparameters) -> dict[str, Any]:
        """The method's own options with "auto" replaced by its defaults, range-checked."""
        options: dict[str, Any] = {}
        for name, default in self.option_defaults.items():
            value = getattr(requested, name, "auto")
            value = default if value in ("auto", None) else value
            low, high = self.option_ranges.get(name, (float("-inf"), float("inf")))
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not low <= value <= high:
                param = f"{param_prefix(self.name)}.{name}"
                raise invalid(f"{param} must be between {low} and {high}; got {value}", param=param)
            options[name] = value
        return options


def param_prefix(method: str) -> str:
    return f"method.{method}.hyperparameters"


_REGISTRY: dict[str, TrainingMethod] = {}


def _load() -> dict[str, TrainingMethod]:
    if not _REGISTRY:
        for module_name in _MODULES:
            method = importlib.import_module(f"{__name__}.{module_name}").METHOD
            _REGISTRY[method.name] = method
    return _REGISTRY


def names() -> tuple[str, ...]:
    return tuple(_load())


def get(name: str) -> TrainingMethod:
    """The method called `name`; a 400 naming `method.type` for an unknown one."""
    methods = _load()
    if name not in methods:
        raise invalid(f"method.type {name!r} is not supported; use one of {', '.join(methods)}",
                      param="method.type")
    return methods[name]


def all_methods() -> tuple[TrainingMethod, ...]:
    return tuple(_load().values())
