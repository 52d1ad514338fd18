"""The operator's eval policy: by tenant tier, the evals every job runs and the gates every
fine-tuned model must pass, whatever the job body says. Part of `tuneforge.settings.Settings`
(read from `TUNEFORGE_GATE_POLICY` as JSON text); `eval/policy.py` applies it when a job is
created and resolved. docs/registry.md, "Gate policy"."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuneforge.domain.vocab import TIERS

RequiredEval = Literal["golden", "safety"]


class PolicyGate(BaseModel):
    """A gate the operator requires; a job may make it stricter, never looser."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    metric: str = Field(min_length=1, max_length=128,
                        description="A result key, e.g. golden.loss, safety.refusal_rate, validation.loss.")
    op: Literal["<", "<=", ">", ">=", "=="] = Field(description="How the value compares with the threshold.")
    threshold: float = Field(description="The bound the value is compared with.")
    relative_to_base: bool = Field(
        False, description="Compare fine-tuned minus base (a difference) instead of the fine-tuned value.")

    @field_validator("threshold")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("a gate's threshold must be a finite number")
        return value


class TierGatePolicy(BaseModel):
    """What every job of one tier is held to."""

    model_config = ConfigDict(extra="forbid")

    eval_required: bool = Field(
        False, description="Every job is evaluated: a body's eval.enabled = false is refused. Implied by "
                           "required_evals or gates.")
    required_evals: list[RequiredEval] = Field(
        default_factory=list, description='Platform evals every job runs: "golden" (general ability) and/or '
                                          '"safety" (refusals); a body may not turn them off.')
    gates: list[PolicyGate] = Field(
        default_factory=list, description="Gates every model of the tier must pass, added to the job's own; a "
                                          "job's gate on the same metric may be stricter, never looser.")

    @property
    def requires_eval(self) -> bool:
        return self.eval_required or bool(self.required_evals) or bool(self.gates)

    @property
    def evals(self) -> frozenset[str]:
        """The platform evals the tier requires: those named, and those its gates' metrics come from."""
        suites = {gate.metric.split(".", 1)[0] for gate in self.gates}
        return frozenset(self.required_evals) | (suites & {"golden", "safety"})


class GateSettings(BaseModel):
    gate_policy: dict[str, TierGatePolicy] = Field(
        default_factory=dict,
        description='Eval policy by tenant tier (JSON): eval_required, required_evals ("golden", "safety") and '
                    'gates, e.g. {"free": {"required_evals": ["golden", "safety"], "gates": [{"metric": '
                    '"golden.loss", "op": "<=", "threshold": 0.5, "relative_to_base": true}]}}. A job body may add '
                    'evals and gates and make a required gate stricter; turning a required eval off or loosening '
                    'a required gate answers 400 (code below_gate_policy). A tier not named has no policy. '
                    'docs/registry.md, "Gate policy".')

    @field_validator("gate_policy", mode="before")
    @classmethod
    def _known_tiers(cls, value: object) -> object:
        if isinstance(value, dict):
            unknown = sorted(str(tier) for tier in value if tier not in TIERS)
            if unknown:
                raise ValueError(f"TUNEFORGE_GATE_POLICY names unknown tier(s) {', '.join(unknown)}; the tiers are "
                                 f"{', '.join(TIERS)}")
        return value

    def gate_policy_of(self, tier: str | None) -> TierGatePolicy:
        """The tier's policy; a tier the operator did not name requires nothing."""
        return self.gate_policy.get(tier or "", TierGatePolicy())
