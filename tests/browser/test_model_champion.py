"""A model's page shows both comparisons: base model vs this model (the eval results and gates)
and the lineage's production model vs this model (champion and challenger), and the API's
refusal of a challenger that is worse than production."""

from __future__ import annotations

import pytest

from tests.browser.steps import assert_fits, client, sign_in
from tests.helpers.lora import save_random_lora
from tests.helpers.registry import add_adapter_model
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FineTunedModel
from tuneforge.eval import shipped
from tuneforge.registry import champion

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]

GATE = {"metric": "golden.loss", "op": "<=", "threshold": 0.5, "relative_to_base": True}
SETS = {"golden": {"set": shipped.digest(shipped.GOLDEN_FILE)}}


def _report(loss: float) -> dict:
    gate = {**GATE, "value": loss - 2.0, "passed": True, "reason": f"golden.loss rose by {loss - 2.0:.2f}"}
    return {"passed": True, "gates": [gate], "suggestions": [], "eval_sets": SETS}


def test_the_model_page_shows_the_production_comparison(plane, page, shots, tmp_path):
    platform = plane.plane.platform
    with platform.db.session() as session:
        tenant = tenant_repo.by_name(session, "acme")
        base = base_model_repo.by_name(session, "tiny-chat")
        ids = []
        for name, loss, stage in (("prod", 1.0, "production"), ("next", 2.4, "dev")):
            adapter = save_random_lora(plane.model_dir, tmp_path / name, seed=len(ids) + 40)
            ids.append(add_adapter_model(
                session, platform.store, tenant, base, name, adapter, stage=stage, promotable=True,
                gate_report=_report(loss),
                eval_results={"base": {"golden.loss": 2.0}, "fine_tuned": {"golden.loss": loss}}))
        production, challenger = ids
        row = session.query(FineTunedModel).filter_by(model_id=challenger).one()
        row.gate_report = {**row.gate_report, "champion": champion.compare(session, row)}  # as registration does
    api = client(plane.url, plane.key_a)
    refusal = api.post(f"/v1/models/{challenger}/promote", json={"stage": "staging"})
    assert refusal.status_code == 409 and refusal.json()["error"]["code"] == "champion_regression"

    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/models/{challenger}")
    verdict = page.get_by_test_id("champion-verdict")
    verdict.filter(has_text=production).wait_for()
    assert verdict.inner_text().startswith("✗")
    cells = page.locator('[data-testid="champion-table"] tbody tr td').all_inner_texts()
    assert cells[:3] == ["golden.loss", "1", "2.4"] and cells[4] == "<= 0.5" and cells[5] == "✗ Failed"
    assert "at most 0.50 higher is allowed" in cells[6]
    assert page.locator('[data-testid="eval-gates"] tbody tr').get_attribute("data-passed") == "true"
    page.get_by_label("Stage", exact=True).select_option("staging")
    page.get_by_role("button", name="Move to stage").click()
    page.get_by_role("alert").filter(has_text=refusal.json()["error"]["message"]).wait_for()
    assert_fits(page)
    shots(page, "worse than production")
