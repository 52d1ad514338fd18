"""The catalogue of training methods, by name: what the control plane knows of each.

A method is one spec (`TrainingMethod`) in a module of this package: its name,
its hyperparameters (the request's pydantic model, whose field descriptions
are the documentation), its own options (a second pydantic model: the values
a run uses, with their defaults and bounds), the example kinds it trains on,
its default learning rates, what the memory model and the gates need to know
of it, its default eval, and its objective, named by a dotted path that only
the trainer resolves (`train/objectives/`). Nothing here imports torch: the
API, data checks, estimates, the memory model, the scheduler and the trainer
all look a method up here, and the trainer alone turns it into a loss.

A method's options travel typed: `resolve_options` turns the request's block
into the options model ("auto" becomes the default, once, here); the job spec
stores its dump; the trainer re-validates the dump into the same model
(`TrainingMethod.stored_options`) and hands the objective that object.

Adding a method: write `methods/NAME.py` defining `METHOD`, add "NAME" to
`_MODULES` below, write its objective in `train/objectives/NAME.py`, then
tests and docs (docs/methods.md, docs/architecture.md "How to add a method").
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from tuneforge.data.shapes import MethodFit
from tuneforge.domain.errors import from_validation_errors, invalid
from tuneforge.domain.job_config import BLOCK_FIELDS, SupervisedHyperparameters
from tuneforge.domain.vocab import TRAINING_TYPES

# The registration lines: one module per method, in the order the docs list them.
_MODULES = ("supervised", "dpo", "orpo", "cpt", "kto", "simpo", "reinforcement")

# Fields every method shares (`domain.spec.Hyperparameters`); anything else a
# method's model declares is one of its own options (`Hyperparameters.method_options`).
COMMON_FIELDS = frozenset(SupervisedHyperparameters.model_fields)


class NoOptions(BaseModel):
    """The options of a method that has none of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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
    data_kinds: tuple[str, ...]  # example kinds (`data.example.Kind`) it trains on
    learning_rate: Mapping[str, float]  # default learning rate by training type (lora, qlora, full)
    objective: str  # "module:function" building its `train.objective.Objective` from its options (torch side)
    options: type[BaseModel] = NoOptions  # its own options, resolved: defaults and bounds on the fields
    sequences_per_example: int = 1  # sequences one example puts through the model (memory model)
    beta_pulls_to_reference: bool = False  # its `beta` keeps the policy near the reference (gate advice)
    default_eval: EvalDefaults = EvalDefaults()
    block_fields: tuple[str, ...] = ()  # what its method block holds beside hyperparameters (a grader)
    generates: bool = False  # it samples completions during training (the memory model counts their KV cache)

    def __post_init__(self) -> None:
        missing = set(TRAINING_TYPES) - set(self.learning_rate)
        if missing:
            raise ValueError(f"method {self.name!r} has no default learning rate for {sorted(missing)}")
        unknown = set(self.options.model_fields) - set(self.hyperparameters.model_fields)
        if unknown:
            raise ValueError(f"method {self.name!r}: options {sorted(unknown)} are not in its hyperparameters")

    @property
    def fit(self) -> MethodFit:
        """What the data checks need of it: its name and the example kinds it accepts."""
        return MethodFit(self.name, self.data_kinds)

    def parse_hyperparameters(self, raw: Any) -> SupervisedHyperparameters:
        """The method's typed block; a 400 naming `method.<name>.hyperparameters.<field>` otherwise."""
        if isinstance(raw, self.hyperparameters):
            return raw
        if isinstance(raw, BaseModel):
            raw = raw.model_dump(exclude_unset=True)
        for name in BLOCK_FIELDS:
            given = isinstance(raw, dict) and raw.get(name) is not None
            if given and name not in self.block_fields:
                raise invalid(f"method.{self.name}.{name}: the {self.name} method takes no {name}",
                              param=f"method.{self.name}.{name}")
            if not given and name in self.block_fields and self.options.model_fields[name].is_required():
                raise invalid(f"method.{self.name}.{name} is required", param=f"method.{self.name}.{name}")
        try:
            return self.hyperparameters.model_validate(raw or {})
        except ValidationError as exc:
            raise from_validation_errors(exc.errors(), ("method", self.name, "hyperparameters"),
                                         self.hyperparameters) from None

    def resolve_options(self, requested: SupervisedHyperparameters) -> BaseModel:
        """The method's own options: "auto" (or absent) becomes the field's default; a value
        outside a field's bounds is a 400 naming `method.<name>.hyperparameters.<field>`."""
        given: dict[str, Any] = {}
        for name, info in self.options.model_fields.items():
            value = getattr(requested, name, "auto")
            if value in ("auto", None):
                continue
            low, high = bounds(info)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not low <= value <= high:
                param = f"{param_prefix(self.name)}.{name}"
                raise invalid(f"{param} must be between {low} and {high}; got {value}", param=param)
            given[name] = value
        try:
            return self.options.model_validate(given)
        except ValidationError as exc:
            raise from_validation_errors(exc.errors(), ("method", self.name, "hyperparameters"),
                                         self.options) from None

    def stored_options(self, dump: Mapping[str, Any]) -> BaseModel:
        """The options a job spec stores (`Hyperparameters.method_options`), typed again."""
        return self.options.model_validate(dict(dump))


def bounds(info: FieldInfo) -> tuple[float, float]:
    """The inclusive bounds a field declares (`Field(ge=..., le=...)`), infinite where it declares none."""
    low, high = float("-inf"), float("inf")
    for item in info.metadata:  # pydantic keeps each bound as an object with that attribute
        if getattr(item, "ge", None) is not None:
            low = float(item.ge)
        elif getattr(item, "le", None) is not None:
            high = float(item.le)
    return low, high


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
