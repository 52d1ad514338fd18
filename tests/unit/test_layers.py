"""The torch-free floors stay torch-free, and the method catalogue types each method's options."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuneforge import methods
from tuneforge.domain.errors import ApiError


def test_the_catalogue_and_planning_load_without_torch() -> None:
    code = ("import sys, tuneforge.methods, tuneforge.planning.memory, tuneforge.planning.hyperparams, "
            "tuneforge.planning.policy, tuneforge.planning.pools, tuneforge.methods.kto\n"
            "tuneforge.methods.all_methods()\n"
            "loaded = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
            "print(','.join(loaded))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("method", methods.names())
def test_every_method_resolves_typed_options_that_survive_the_spec(method: str) -> None:
    spec = methods.get(method)
    needed = {"grader": {"type": "string_check", "name": "g", "operation": "eq", "input": "a", "reference": "a"}}
    options = spec.resolve_options(spec.parse_hyperparameters({k: v for k, v in needed.items()
                                                               if k in spec.block_fields}))
    assert isinstance(options, spec.options)
    assert spec.stored_options(options.model_dump()) == options  # what the trainer reads back
    module, _, function = spec.objective.partition(":")
    assert module == f"tuneforge.train.objectives.{method}" and function == "build"


def test_an_option_out_of_bounds_names_its_field() -> None:
    dpo = methods.get("dpo")
    with pytest.raises(ApiError) as caught:
        dpo.resolve_options(dpo.parse_hyperparameters({"beta": 1000.0}))
    assert caught.value.param == "method.dpo.hyperparameters.beta"
    assert "between 0.0001 and 100.0" in caught.value.message
    assert dpo.resolve_options(dpo.parse_hyperparameters({"beta": 0.3})).beta == 0.3  # type: ignore[attr-defined]


def test_a_stored_option_the_method_lacks_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="gamma"):
        methods.get("dpo").stored_options({"beta": 0.1, "gamma": 1.0})


def test_every_table_kept_per_tier_has_exactly_the_tiers() -> None:
    """The tiers are defined once (`domain/vocab.py`); every per-tier table names each of them."""
    from tuneforge.domain.vocab import TIERS
    from tuneforge.planning.policy_inputs import TIER_RANK
    from tuneforge.services.datasets import checks as datasets
    from tuneforge.services.tenancy import quotas
    from tuneforge.settings import DEFAULT_RATE_LIMITS, Settings
    from tuneforge.settings.money import DEFAULT_STORAGE_QUOTAS
    from tuneforge.settings.serving import DEFAULT_TOKENS_IN_FLIGHT_BY_TIER

    tables = {"rate limits": DEFAULT_RATE_LIMITS, "storage quotas": DEFAULT_STORAGE_QUOTAS,
              "tokens in flight": DEFAULT_TOKENS_IN_FLIGHT_BY_TIER, "max examples": datasets.MAX_EXAMPLES_BY_TIER,
              "quota defaults": quotas.TIER_DEFAULTS, "queue rank": TIER_RANK,
              "capacity by tier": Settings().capacity_by_tier}
    assert {name: sorted(table) for name, table in tables.items()} == {name: sorted(TIERS) for name in tables}


QUERY_BUILDERS = {"select", "insert", "update", "delete", "text", "func", "bindparam", "and_", "or_", "case",
                  "literal_column", "exists", "union_all", "tuple_"}


def test_no_module_outside_db_builds_sql() -> None:
    """Every query lives in `db/` (its repos): elsewhere nothing imports SQLAlchemy's query builders."""
    import ast
    from pathlib import Path

    import tuneforge

    package = Path(tuneforge.__file__).parent
    builders: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] == "db":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
                used = {alias.name for alias in node.names} & QUERY_BUILDERS
                if used:
                    builders.setdefault(str(path.relative_to(package)), set()).update(used)
            elif isinstance(node, ast.Import) and any(alias.name == "sqlalchemy" for alias in node.names):
                builders.setdefault(str(path.relative_to(package)), set()).add("sqlalchemy (the whole package)")
    assert builders == {}
