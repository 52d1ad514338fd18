"""The operator's gate policy applied to a job's `eval` body (settings/gates.py holds the policy).

A body may add evals and gates and make a required gate stricter. It may not turn eval off, turn
a required eval off, or give a gate on a required gate's metric (same `relative_to_base`, bounding
the same side) that lets through a value the required gate refuses: each answers 400 naming the
field, code `below_gate_policy`, when the job is created, before anything runs. When the job is
resolved, the required evals are switched on and every required gate the body's own gates do not
already cover (as strict or stricter) is added to the gates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import EvalConfig
from tuneforge.eval.gates import OPS
from tuneforge.settings.gates import PolicyGate, TierGatePolicy

CODE = "below_gate_policy"
_UPPER, _LOWER = frozenset({"<", "<="}), frozenset({">", ">="})


def _side(op: str) -> str:
    return "upper" if op in _UPPER else "lower" if op in _LOWER else "exact"


def at_least_as_strict(gate: Mapping[str, Any], required: PolicyGate) -> bool | None:
    """Whether `gate` refuses every value `required` refuses; None when the two bound different
    things (another metric, another comparison, the other side), so neither loosens the other."""
    if gate["metric"] != required.metric or bool(gate.get("relative_to_base")) != required.relative_to_base:
        return None
    op, threshold = gate["op"], float(gate["threshold"])
    if required.op == "==":
        return None if op != "==" else threshold == required.threshold
    if op == "==":  # pinning the value: as strict when the pinned value passes the required bound
        return OPS[required.op](threshold, required.threshold)
    if _side(op) != _side(required.op):
        return None
    if threshold != required.threshold:
        return threshold < required.threshold if required.op in _UPPER else threshold > required.threshold
    return len(op) == 1 or len(required.op) == 2  # "<" is stricter than "<=" at the same bound


def _describe(gate: PolicyGate) -> str:
    relative = " relative to the base model" if gate.relative_to_base else ""
    return f"{gate.metric} {gate.op} {gate.threshold:g}{relative}"


def check(policy: TierGatePolicy, config: EvalConfig | None, tier: str) -> None:
    """At creation: refuse a body that turns off what the tier requires or loosens a required gate."""
    if config is None:
        return
    sets = config.model_fields_set
    if policy.requires_eval and "enabled" in sets and not config.enabled:
        raise invalid(f"eval.enabled: jobs of the {tier} tier are evaluated after training (the platform's gate "
                      "policy); leave eval.enabled out or set it to true", param="eval.enabled", code=CODE)
    for name in sorted(policy.evals):
        if name in sets and not getattr(config, name):
            raise invalid(f"eval.{name}: the {name} eval is required for the {tier} tier (the platform's gate "
                          f"policy); leave eval.{name} out or set it to true", param=f"eval.{name}", code=CODE)
    for index, gate in enumerate(config.gates or []):
        asked = gate.model_dump()
        for required in policy.gates:
            if at_least_as_strict(asked, required) is False:
                field = "op" if float(asked["threshold"]) == required.threshold else "threshold"
                raise invalid(f"eval.gates[{index}].{field}: {asked['metric']} {asked['op']} {asked['threshold']:g} "
                              f"is looser than the {tier} tier's required gate {_describe(required)}; a job may "
                              "make a required gate stricter, never looser", param=f"eval.gates[{index}].{field}",
                              code=CODE)


def required_evals(policy: TierGatePolicy) -> dict[str, bool]:
    """The eval switches the policy forces on: {"enabled": True, "golden": True, ...}."""
    if not policy.requires_eval:
        return {}
    return {"enabled": True, **{name: True for name in policy.evals}}


def with_required_gates(policy: TierGatePolicy, gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's gates and, after them, each required gate none of them covers as strictly."""
    added = [required.model_dump() for required in policy.gates
             if not any(at_least_as_strict(gate, required) for gate in gates)]
    return [*gates, *added]
