"""A sweep's search space and the samplers that draw trials from it (pure, seeded).

The space maps a parameter to its values. A parameter is a hyperparameter's name (placed in
`method.<type>.hyperparameters` of the job body) or a dotted path into the body that starts
with `training_type.` or `method.` (e.g. `training_type.rank`):

    {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
     "batch_size": {"type": "choice", "values": [4, 8, 16]},
     "training_type.rank": {"type": "int", "low": 4, "high": 32, "log": true}}

Samplers: `grid` (every combination of `choice` values, in an order shuffled by the sweep's
seed), `random` (each trial drawn
from its own seeded generator), `tpe` (Optuna's Tree-structured Parzen Estimator, told every
finished trial's objective; trials still running are not yet known to it).
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuneforge.domain.errors import invalid

KINDS = ("choice", "uniform", "loguniform", "int")
SAMPLERS = ("grid", "random", "tpe")
MAX_PARAMETERS = 16
MAX_CHOICES = 64
BODY_ROOTS = ("training_type.", "method.")
_FEISTEL_ROUNDS = 4  # rounds of the grid shuffle; 3 already make a pseudo-random permutation (Luby-Rackoff)


@dataclass(frozen=True)
class Dimension:
    name: str
    kind: str
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False


def parse_space(space: Any) -> list[Dimension]:
    if not isinstance(space, Mapping) or not space:
        raise invalid("search_space must be an object of parameters", param="search_space")
    if len(space) > MAX_PARAMETERS:
        raise invalid(f"search_space takes at most {MAX_PARAMETERS} parameters", param="search_space")
    return [_dimension(str(name), spec) for name, spec in space.items()]


def _dimension(name: str, spec: Any) -> Dimension:
    param = f"search_space.{name}"
    if not name.replace("_", "").replace(".", "").isalnum() or ("." in name and not name.startswith(BODY_ROOTS)):
        raise invalid(f"{param}: a parameter is a hyperparameter's name or a path starting with "
                      f"{' or '.join(BODY_ROOTS)}", param=param)
    if not isinstance(spec, Mapping) or spec.get("type") not in KINDS:
        raise invalid(f"{param}.type must be one of {', '.join(KINDS)}", param=f"{param}.type")
    kind = spec["type"]
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_CHOICES or not all(
                isinstance(v, (int, float, str, bool)) for v in values):
            raise invalid(f"{param}.values must be a list of 1-{MAX_CHOICES} numbers or strings",
                          param=f"{param}.values")
        return Dimension(name, kind, tuple(values))
    low, high = spec.get("low"), spec.get("high")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high))
    if not numbers or not low < high:
        raise invalid(f"{param}: low and high must be numbers with low < high", param=param)
    log = kind == "loguniform" or bool(spec.get("log"))
    if log and low <= 0:
        raise invalid(f"{param}: a log scale needs low > 0", param=f"{param}.low")
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise invalid(f"{param}: low and high of an int parameter must be integers", param=param)
    return Dimension(name, kind, (), float(low), float(high), log)


def grid_size(space: Sequence[Dimension]) -> int:
    return math.prod(len(d.values) for d in space)


def check_sampler(sampler: str, space: Sequence[Dimension]) -> None:
    if sampler not in SAMPLERS:
        raise invalid(f"sampler must be one of {', '.join(SAMPLERS)}", param="sampler")
    if sampler == "grid" and any(d.kind != "choice" for d in space):
        raise invalid("the grid sampler needs every parameter to be a choice", param="sampler")


def grid_point(space: Sequence[Dimension], index: int, seed: int | None = None) -> dict[str, Any]:
    """Combination `index` of the grid: in order, or (with `seed`) in an order shuffled by it, so
    that early stopping does not judge the grid's first corner against itself.

    Nothing the size of the grid is built: 16 parameters of 64 choices are 2**96 points, and
    a sweep runs at most `MAX_TRIALS` of them. The shuffled position is a seeded bijection of
    the index (`shuffled_index`), decoded into one value per parameter (mixed radix, the last
    parameter varying fastest, as `itertools.product` orders the grid)."""
    size = grid_size(space)
    if not 0 <= index < size:
        raise IndexError(f"grid point {index} of a grid of {size}")
    position = index if seed is None else shuffled_index(index, size, f"grid:{seed}")
    point: dict[str, Any] = {}
    for dimension in reversed(space):
        position, digit = divmod(position, len(dimension.values))
        point[dimension.name] = dimension.values[digit]
    return {d.name: point[d.name] for d in space}


def shuffled_index(index: int, size: int, key: str) -> int:
    """Position `index` of a permutation of range(`size`) chosen by `key`, in O(log size) memory.

    A balanced Feistel network on the smallest even number of bits that holds `size` is a
    bijection on that power of two whatever its round function; walking the cycle (apply it
    again while the result is `size` or more) restricts it to range(size). The domain is under
    4 * size, so the walk takes fewer than 4 steps on average.
    """
    if size <= 1:
        return 0
    half_bits = max(1, ((size - 1).bit_length() + 1) // 2)
    mask = (1 << half_bits) - 1
    position = index
    while True:
        left, right = position >> half_bits, position & mask
        for round_number in range(_FEISTEL_ROUNDS):
            left, right = right, left ^ (_round_value(key, round_number, right) & mask)
        position = (left << half_bits) | right
        if position < size:
            return position


def _round_value(key: str, round_number: int, half: int) -> int:
    digest = hashlib.blake2b(f"{key}:{round_number}:{half}".encode(), digest_size=16).digest()
    return int.from_bytes(digest, "big")


def random_point(space: Sequence[Dimension], seed: int, index: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{index}")
    return {d.name: _draw(d, rng) for d in space}


def _draw(d: Dimension, rng: random.Random) -> Any:
    if d.kind == "choice":
        return rng.choice(d.values)
    if d.log:
        value = math.exp(rng.uniform(math.log(d.low), math.log(d.high)))
    else:
        value = rng.uniform(d.low, d.high)
    return int(round(value)) if d.kind == "int" else value


def tpe_point(space: Sequence[Dimension], seed: int, index: int, *, minimize: bool,
              finished: Sequence[tuple[Mapping[str, Any], float]]) -> dict[str, Any]:
    """Optuna's TPE suggestion given the finished trials (parameters, objective)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {d.name: _distribution(d) for d in space}
    study = optuna.create_study(direction="minimize" if minimize else "maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed + index))
    for params, value in finished:
        if all(name in params for name in distributions):
            study.add_trial(optuna.trial.create_trial(params={n: params[n] for n in distributions},
                                                      distributions=distributions, value=value))
    return dict(study.ask(distributions).params)


def _distribution(d: Dimension) -> Any:
    from optuna import distributions

    if d.kind == "choice":
        return distributions.CategoricalDistribution(list(d.values))
    if d.kind == "int":
        return distributions.IntDistribution(int(d.low), int(d.high), log=d.log)
    return distributions.FloatDistribution(d.low, d.high, log=d.log)


def apply(body: Mapping[str, Any], method_type: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The job body of a trial: the sweep's base body with the trial's parameters set."""
    trial = copy.deepcopy(dict(body))
    for name, value in params.items():
        path = name.split(".") if "." in name else ["method", method_type, "hyperparameters", name]
        node = trial
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[path[-1]] = value
    if any("." not in name for name in params):
        trial.setdefault("method", {}).setdefault("type", method_type)
    return trial
