"""The routes pages: a tenant's A/B route with its weights, the versions compared on the
requests the route served (counts, errors, latency, feedback, as the stats API has them), and
traffic shifted from the page."""

from __future__ import annotations

import pytest

from tests.browser.steps import assert_fits, client, sign_in
from tests.helpers.lora import save_random_lora
from tests.helpers.registry import add_adapter_model
from tuneforge.db.repos import base_models as base_model_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FineTunedModel

pytestmark = [pytest.mark.browser, pytest.mark.sqlite_pass_only]


def _register_models(plane, tmp_path) -> list[str]:  # noqa: ANN001 - the running plane
    """Two fine-tuned models of acme on tiny-chat, their gates passed."""
    platform = plane.plane.platform
    models = []
    with platform.db.session() as session:
        tenant = tenant_repo.by_name(session, "acme")
        base = base_model_repo.by_name(session, "tiny-chat")
        for version, seed in (("v1", 31), ("v2", 32)):
            adapter = save_random_lora(plane.model_dir, tmp_path / version, seed=seed)
            models.append(add_adapter_model(session, platform.store, tenant, base, f"route-{version}", adapter))
    return models


def test_a_route_page_compares_its_versions_and_shifts_traffic(plane, page, shots, tmp_path):
    v1, v2 = _register_models(plane, tmp_path)
    api = client(plane.url, plane.key_a)
    created = api.post("/v1/routes", json={"name": "support", "versions": [{"model": v1, "weight": 3},
                                                                           {"model": v2, "weight": 1}]})
    assert created.status_code == 200, created.text
    answers = [api.post("/v1/chat/completions", json={"model": "route:support", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hi"}]}).json()
               for _ in range(6)]
    assert api.post("/v1/routes/support/feedback",
                    json={"response_id": answers[0]["id"], "score": 1}).status_code == 200
    stats = {row["model"]: row for row in api.get("/v1/routes/support/stats").json()["data"]}
    assert sum(row["requests"] for row in stats.values()) == 6

    sign_in(page, plane.url, plane.key_a)
    page.goto(f"{plane.url}/console#/routes")
    page.get_by_role("heading", name="Routes", exact=True).wait_for()
    page.get_by_test_id("routes-table").get_by_role("link", name="support").click()
    page.get_by_role("heading", name="Route support").wait_for()
    rows = page.get_by_test_id("stats-table").locator("tbody tr")
    rows.first.wait_for()
    shown = {row.locator("td").nth(0).inner_text(): [row.locator("td").nth(i).inner_text() for i in range(8)]
             for row in rows.all()}
    assert set(shown) == {v1, v2}
    for model, cells in shown.items():
        assert cells[1] == str(stats[model]["weight"]) and cells[2] == str(stats[model]["requests"])
        assert cells[3] == "0"
    scored = answers[0]["model"]
    assert shown[scored][7] == "1 (1)"
    weights = page.get_by_test_id("weights-table").locator("tbody tr")
    assert [row.locator("td").nth(2).inner_text() for row in weights.all()] == ["75%", "25%"]
    assert_fits(page)
    shots(page, "route compared")

    page.get_by_label("Version", exact=True).select_option(v2)
    page.get_by_label("Share (%)").fill("60")
    page.get_by_role("button", name="Shift traffic").click()
    page.locator("#status").filter(has_text=f"{v2} now takes 60% of support.").wait_for()
    assert [(v["model"], v["weight"]) for v in api.get("/v1/routes/support").json()["versions"]] == [(v1, 40),
                                                                                                      (v2, 60)]
    assert [row.locator("td").nth(2).inner_text() for row in weights.all()] == ["40%", "60%"]

    # a version whose gates failed cannot take traffic: the API's refusal is shown as it said it
    with plane.plane.platform.db.session() as session:
        session.query(FineTunedModel).filter_by(model_id=v1).update({"promotable": False})
    page.get_by_label("Version", exact=True).select_option(v1)
    page.get_by_label("Share (%)").fill("90")
    page.get_by_role("button", name="Shift traffic").click()
    refusal = api.post("/v1/routes/support/promote", json={"model": v1, "weight": 90}).json()["error"]["message"]
    page.get_by_role("alert").filter(has_text=refusal).wait_for()
    shots(page, "refused")
