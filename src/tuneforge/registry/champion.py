"""Champion and challenger: a model that would join its lineage's production model in staging or
production (the challenger) must not be worse than it (the champion) on a gated metric beyond
what the gate allows (`eval/gates.py`, `champion_rule`).

The lineage of a model is its tenant, its base model (name and SHA-256: the weights an adapter
applies to) and its job's suffix: the name a tenant gives a line of models it retrains
(`ft:BASE:TENANT:SUFFIX:TAG`), continued jobs included. The champion is the lineage's newest
registered model in production, other than the challenger.

The champion's figures are its own stored eval results (the fine-tuned side of its job's eval),
not measured again: a trainer reaches only its own job's objects, and the stored figures are the
ones the champion's gates passed on. They are compared only where both evals ran the same way
(`eval_sets`, stored in each gate report): the golden and safety suites on the same shipped set
(and detector and generation length), a task suite on the same task file bytes and metrics, the
validation suite on the same validation file bytes and method; other metrics are listed as not
compared. A model whose report has no `eval_sets` (registered before this rule) compares nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from tuneforge.db.repos import files as file_repo
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import models as model_repo
from tuneforge.db.tables import FileRow, FineTunedModel, Job
from tuneforge.eval import gates as eval_gates
from tuneforge.eval import shipped


def eval_sets(session: Session, job: Job, validation: FileRow | None) -> dict[str, Any]:
    """What each suite of the job's eval ran on and how: equal entries are comparable figures."""
    config = job.resolved.eval if job.resolved is not None else None
    if config is None or not config.enabled:
        return {}
    limit = config.max_examples
    sets: dict[str, Any] = {}
    if config.golden:
        sets["golden"] = {"set": shipped.digest(shipped.GOLDEN_FILE)}
    if config.safety:
        sets["safety"] = {"set": shipped.digest(shipped.SAFETY_FILE), "detector": config.safety_detector,
                          "max_new_tokens": config.max_new_tokens}
    if config.task_file:
        task = file_repo.get(session, job.tenant_id, config.task_file)
        sets["task"] = {"file_sha256": task.sha256 if task else None, "metrics": list(config.metrics or ()),
                        "max_new_tokens": config.max_new_tokens, "max_examples": limit}
    if validation is not None:
        sets["validation"] = {"file_sha256": validation.sha256, "method": job.request.method_type,
                              "max_examples": limit}
    return sets


def suffix_of(session: Session, row: FineTunedModel) -> str | None:
    lineage = row.lineage or {}
    if "suffix" in lineage:
        return lineage["suffix"] or None
    job = job_repo.get(session, row.tenant_id, row.job_id) if row.job_id else None  # (Job's key is pk)
    return (job.suffix or None) if job is not None else None


def champion_of(session: Session, row: FineTunedModel) -> FineTunedModel | None:
    """The lineage's newest registered model in production, other than `row`."""
    suffix = suffix_of(session, row)
    rivals = [other for other in model_repo.listing(session, row.tenant_id, base_model=row.base_model,
                                                    stage="production", include_deprecated=False)
              if other.model_id != row.model_id and other.base_model_sha256 == row.base_model_sha256
              and suffix_of(session, other) == suffix]
    return rivals[-1] if rivals else None


def _gates(report: dict[str, Any]) -> list[eval_gates.Gate]:
    """The gates the challenger's report checked (a not-evaluated marker has no rule)."""
    return [eval_gates.Gate(str(g["metric"]), str(g["op"]), float(g["threshold"]), bool(g.get("relative_to_base")))
            for g in report.get("gates") or [] if g.get("op") in eval_gates.OPS and g.get("threshold") is not None]


def compare(session: Session, row: FineTunedModel) -> dict[str, Any]:
    """The challenger `row` against its lineage's champion: {"model", "passed", "comparisons", "reason"}."""
    champion = champion_of(session, row)
    if champion is None:
        return {"model": None, "passed": True, "comparisons": [],
                "reason": "no model of this lineage is in production: nothing to compare with"}
    mine, theirs = row.gate_report or {}, champion.gate_report or {}
    sets, their_sets = mine.get("eval_sets") or {}, theirs.get("eval_sets") or {}
    comparable = frozenset(suite for suite, ran in sets.items() if ran is not None and their_sets.get(suite) == ran)
    comparisons = eval_gates.check_champion(
        _gates(mine), (row.eval_results or {}).get("fine_tuned") or {},
        (champion.eval_results or {}).get("fine_tuned") or {}, comparable)
    failed = [c["reason"] for c in comparisons if not c["passed"]]
    compared = sum(1 for c in comparisons if c["compared"])
    reason = ("; ".join(failed) if failed else
              f"not worse than the production model on {compared} gated metric(s)" if compared else
              "no gated metric was measured the same way for both models")
    return {"model": champion.model_id, "passed": not failed, "comparisons": comparisons, "reason": reason}
