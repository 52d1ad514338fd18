// A/B routes: the tenant's routes with their versions' weights; a route's page compares its
// versions (requests, errors, latency, feedback) and shifts traffic between them.

import {get, post} from "../api.js";
import {h, fill, facts, field, formatNumber, formatTime, section, dropdown, table} from "../dom.js";
import {href} from "../router.js";
import {announce, busy} from "../ui.js";

function percent(share) {
  return `${formatNumber(share * 100, 3)}%`;
}

function versionsText(route) {
  return route.versions.map((v) => `${v.model} · ${percent(v.share)}`).join("\n");
}

export async function routesView(main) {
  const routes = (await get("/v1/routes")).data;
  fill(main, h("h1", null, "Routes"),
    h("p", {class: "muted"}, "A route splits the traffic of one name between model versions: requests name it as ",
      h("code", null, "model: \"route:NAME\""), ". Create one with POST /v1/routes (docs/serving.md)."),
    section("Your routes", routes.length
      ? h("div", {class: "table-wrap"}, table("Your routes", ["Route", "Versions", "Updated"], routes.map((route) => [
        h("a", {href: href("routes", route.name)}, route.name),
        h("span", {class: "wrap pre"}, versionsText(route)), formatTime(route.updated_at)]),
      {hideCaption: true, testid: "routes-table"}))
      : h("p", {class: "muted"}, "No routes yet.")));
}

function statsRows(stats) {
  return stats.map((row) => [
    h("a", {href: href("models", row.model), class: "wrap"}, row.model),
    row.weight === null ? "removed" : String(row.weight),
    formatNumber(row.requests), formatNumber(row.errors),
    formatNumber(row.latency_ms.p50), formatNumber(row.latency_ms.p95),
    formatNumber(row.first_token_ms_mean),
    row.feedback.count ? `${formatNumber(row.feedback.mean)} (${row.feedback.count})` : "—",
  ]);
}

export async function routeView(main, params) {
  const path = `/v1/routes/${encodeURIComponent(params.name)}`;
  let route = await get(path);
  const weights = h("div", {"data-testid": "route-versions"});
  const stats = h("div", {"data-testid": "route-stats"});
  const versionSelect = dropdown(route.versions.map((v) => [v.model, v.model]), {name: "model"});
  const share = h("input", {type: "number", name: "weight", min: 1, max: 100, step: 1, value: 100, required: true});
  const shift = h("button", {type: "submit"}, "Shift traffic");
  const shiftError = h("p", {class: "form-error", role: "alert", hidden: true});
  const form = h("form", {class: "row", "aria-label": "Shift traffic to a version"},
    field("Version", versionSelect), field("Share (%)", share, "The others share the rest in proportion to their weights."),
    shift);

  function drawWeights() {
    fill(weights, table("Weights", ["Version", "Weight", "Share"], route.versions.map((v) => [
      h("span", {class: "wrap"}, v.model), String(v.weight), percent(v.share)]), {hideCaption: true, testid: "weights-table"}));
  }

  async function drawStats() {
    const answer = await get(`${path}/stats`);
    fill(stats, table("Per version, last 7 days", ["Version", "Weight", "Requests", "Errors", "p50 ms", "p95 ms",
      "First chunk ms", "Feedback (n)"], statsRows(answer.data), {testid: "stats-table"}));
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    busy(shift, async () => {
      shiftError.hidden = true;
      try {
        route = await post(`${path}/promote`, {model: versionSelect.value, weight: Number(share.value)});
      } catch (error) {
        shiftError.textContent = error.message;
        shiftError.hidden = false;
        return;
      }
      drawWeights();
      await drawStats();
      announce(`${versionSelect.value} now takes ${share.value}% of ${route.name}.`);
    });
  });

  drawWeights();
  await drawStats();
  fill(main, h("h1", null, "Route ", h("span", {class: "mono"}, route.name)),
    facts([["Use as", h("code", null, route.model)], ["Id", route.id], ["Created", formatTime(route.created_at)],
      ["Updated", formatTime(route.updated_at)]]),
    section("Weights", weights, form, shiftError),
    section("Versions compared", stats));
}
