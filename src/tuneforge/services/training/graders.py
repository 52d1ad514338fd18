"""`/v1/fine_tuning/alpha/graders/run` and `/validate`: a tenant tries a grader before training with it.

Both take OpenAI's grader object. `validate` answers the grader back once it
parses and checks (`graders/check.py`); `run` scores one model sample against
one item and answers OpenAI's result (reward, sub_rewards, metadata with the
error flags). Model graders' judges are asked through services/serving/judges.py
(the tenant's, the operator's or this platform's models; tokens metered to the
tenant). Python graders run in the sandbox (`graders/sandbox.py`) and
only there: on a host that cannot sandbox they are refused (400 naming
`grader.source`). A process runs at most `grader_sandboxes` of them at once;
one more is answered 429 with Retry-After. Routes are synchronous, so all of
this runs in the API's thread pool, never on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

from tuneforge.db.tables import Tenant
from tuneforge.domain.errors import invalid, rate_limited
from tuneforge.domain.graders import has_type
from tuneforge.domain.job_config import JobRequest
from tuneforge.eval.judges import embeddings_for
from tuneforge.graders import check, sandbox, score
from tuneforge.graders.score import GradingTools, Judge
from tuneforge.graders.templates import Sample
from tuneforge.services.context import Platform
from tuneforge.services.serving.judges import TenantJudges
from tuneforge.settings import Settings

RETRY_AFTER_S = 2.0
MAX_ITEM_FIELDS = 1024
_slots_lock = threading.Lock()
_slots_held: dict[int, int] = {}  # id(settings) -> sandboxes running for it in this process


def tools_for(settings: Settings, judge: Judge | None) -> GradingTools:
    """What graders may use on this host: the sandbox where it works, `judge` for model graders
    (services/serving/judges.py) and the embeddings endpoint the operator names (without it cosine
    is refused)."""
    embeddings = embeddings_for(settings.grader_embeddings, settings.eval_endpoints)
    python = None
    if sandbox.available(settings.grader_python) is None:
        python = partial(_sandbox, python=settings.grader_python, timeout_s=settings.grader_timeout_s)
    return GradingTools(python=python, judge=judge, embeddings=embeddings)


def tenant_judges(platform: Platform, tenant: Tenant) -> TenantJudges:
    return TenantJudges(platform, tenant.tenant_id, tenant.tier, tenant_name=tenant.name)


def _sandbox(source: str, *, python: str, timeout_s: float) -> sandbox.PythonSandbox:
    return sandbox.PythonSandbox(source, python=python, limits=replace(sandbox.SandboxLimits(), wall_time_s=timeout_s))


@contextmanager
def _slot(settings: Settings, grader: Any) -> Iterator[None]:
    """One of the process's sandbox slots for a python grader (429 when none is free)."""
    if not has_type(grader, "python"):
        yield
        return
    key = id(settings)
    with _slots_lock:
        held = _slots_held.get(key, 0)
        if held >= settings.grader_sandboxes:
            raise rate_limited(f"{held} python graders are running on this server, the most it runs at once; "
                               "try again shortly", code="too_many_graders", retry_after=RETRY_AFTER_S)
        _slots_held[key] = held + 1
    try:
        yield
    finally:
        with _slots_lock:
            _slots_held[key] -= 1


def grader_prefix(request: JobRequest) -> str:
    return f"method.{request.method_type}.grader"


def required_fields(request: JobRequest, requested: Any) -> tuple[str, ...]:
    """The item fields every line of a job's data must hold: those its grader reads."""
    raw = getattr(requested, "grader", None)
    if raw is None:
        return ()
    return tuple(sorted(check.item_fields(check.parse(raw, grader_prefix(request)))))


def check_job(settings: Settings, request: JobRequest, requested: Any, judge: Judge) -> None:
    """A job whose method takes a grader: the grader parses and can run here, its judges for this
    tenant (`judge`: their check), and what the method's options need of the rest of the request
    holds; a 400 naming the field otherwise."""
    raw = getattr(requested, "grader", None)
    if raw is None:
        return
    prefix = grader_prefix(request)
    grader = check.parse(raw, prefix)
    with _slot(settings, grader):
        check.check(grader, tools_for(settings, judge), prefix)
    kl_coef = getattr(requested, "kl_coef", "auto")
    if kl_coef not in ("auto", None, 0, 0.0) and request.training_type_kind == "full":
        param = f"method.{request.method_type}.hyperparameters.kl_coef"
        raise invalid(f"{param}: the KL penalty compares the policy with its base by turning the adapter off; "
                      "a full fine-tune has no adapter (use LoRA, or kl_coef 0)", param=param)
    response_format = getattr(requested, "response_format", None)
    if response_format is not None:
        check_response_format(response_format, f"method.{request.method_type}.response_format")


def check_response_format(raw: Any, param: str) -> None:
    """OpenAI's `{type: json_schema, json_schema: {name, schema, strict?}}` (or `{type: json_object}`)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "json_object":
        return
    schema = raw.get("json_schema") if kind == "json_schema" else None
    if not isinstance(schema, dict) or not isinstance(schema.get("schema"), dict):
        raise invalid(f"{param} must be {{\"type\": \"json_schema\", \"json_schema\": {{\"name\": ..., "
                      "\"schema\": {...}}} or {\"type\": \"json_object\"}", param=param)


def validate(platform: Platform, tenant: Tenant, raw_grader: Any) -> dict[str, Any]:
    grader = check.parse(raw_grader, "grader")
    with _slot(platform.settings, grader):
        check.check(grader, tools_for(platform.settings, tenant_judges(platform, tenant)), "grader")
    return {"grader": grader.model_dump(mode="json", exclude_none=True)}


def run(platform: Platform, tenant: Tenant, raw_grader: Any, model_sample: str, item: Any) -> dict[str, Any]:
    """One sample scored; a model grader's judge tokens are metered to the tenant (no job)."""
    grader = check.parse(raw_grader, "grader")
    if item is None:
        item = {}
    if not isinstance(item, dict):
        raise invalid("item must be a JSON object (the dataset line the grader reads)", param="item")
    if len(item) > MAX_ITEM_FIELDS:
        raise invalid(f"item has {len(item)} fields; at most {MAX_ITEM_FIELDS}", param="item")
    missing = check.missing_fields(grader, item)
    if missing:
        raise invalid(f"item has no field {missing[0]!r}, which the grader reads as {{{{item.{missing[0]}}}}}",
                      param=f"item.{missing[0]}")
    tools = tools_for(platform.settings, tenant_judges(platform, tenant))
    with _slot(platform.settings, grader):
        check.check(grader, tools, "grader")
        result = score.score_batch(grader, [Sample.from_text(model_sample)], [item], tools)[0]
    return score.result_json(grader, result)
