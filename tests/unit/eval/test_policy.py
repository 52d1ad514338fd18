"""Which gate is at least as strict as a required one (eval/policy.py)."""

from __future__ import annotations

import pytest

from tuneforge.eval.policy import at_least_as_strict, with_required_gates
from tuneforge.settings.gates import PolicyGate, TierGatePolicy

LOSS = PolicyGate(metric="golden.loss", op="<=", threshold=0.5, relative_to_base=True)
ACCURACY = PolicyGate(metric="golden.token_accuracy", op=">", threshold=-0.1, relative_to_base=True)


def _gate(metric: str, op: str, threshold: float, relative: bool = True) -> dict:
    return {"metric": metric, "op": op, "threshold": threshold, "relative_to_base": relative}


@pytest.mark.parametrize(("gate", "required", "expected"), [
    (_gate("golden.loss", "<=", 0.2), LOSS, True),
    (_gate("golden.loss", "<", 0.5), LOSS, True),
    (_gate("golden.loss", "<=", 0.5), LOSS, True),
    (_gate("golden.loss", "<=", 0.6), LOSS, False),
    (_gate("golden.loss", "==", 0.0), LOSS, True),
    (_gate("golden.loss", "==", 0.7), LOSS, False),
    (_gate("golden.loss", ">=", -1.0), LOSS, None),  # the other side: another condition
    (_gate("golden.loss", "<=", 9.0, relative=False), LOSS, None),  # an absolute bound: another condition
    (_gate("validation.loss", "<=", 9.0), LOSS, None),
    (_gate("golden.token_accuracy", ">=", -0.1), ACCURACY, False),  # ">=" lets -0.1 through, ">" does not
    (_gate("golden.token_accuracy", ">", -0.1), ACCURACY, True),
    (_gate("golden.token_accuracy", ">=", 0.0), ACCURACY, True),
])
def test_strictness(gate, required, expected):
    assert at_least_as_strict(gate, required) is expected


def test_required_gates_not_covered_are_added_after_the_job_s():
    own = [_gate("golden.loss", "<", 0.1)]
    merged = with_required_gates(TierGatePolicy(gates=[LOSS, ACCURACY]), own)
    assert merged == [own[0], ACCURACY.model_dump()]
