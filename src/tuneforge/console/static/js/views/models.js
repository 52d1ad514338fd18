// The model registry: base models and the tenant's fine-tuned models with their stage,
// gates and lineage; a model's page promotes it and lists every stage move.

import {get, post} from "../api.js";
import {h, fill, facts, field, formatTime, formatValue, section, dropdown, table} from "../dom.js";
import {href} from "../router.js";
import {announce, busy} from "../ui.js";
import {evalResults} from "./evalresults.js";

const STAGES = ["dev", "staging", "production", "archived"];

function gateSummary(model) {
  if (model.type !== "fine-tuned") return "—";
  if (!model.gates || !model.gates.length) return model.promotable ? "no gates" : "not promotable";
  const failed = model.gate_failures || [];
  return failed.length ? `✗ ${failed.length} failed` : `✓ ${model.gates.length} passed`;
}

export async function modelsView(main) {
  const models = (await get("/v1/models")).data;
  const bases = models.filter((m) => m.type !== "fine-tuned");
  const tuned = models.filter((m) => m.type === "fine-tuned");
  fill(main, h("h1", null, "Models"),
    section("Fine-tuned models", tuned.length
      ? h("div", {class: "table-wrap"}, h("table", {class: "grid", "data-testid": "models-table"},
        h("caption", {class: "visually-hidden"}, "Your fine-tuned models"),
        h("thead", null, h("tr", null, ["Model", "Base", "Stage", "Gates", "Job", "Created"].map((t) => h("th", {scope: "col"}, t)))),
        h("tbody", null, tuned.map((model) => h("tr", {"data-model": model.id, "data-stage": model.stage},
          h("td", {class: "wrap"}, h("a", {href: href("models", model.id)}, model.id)),
          h("td", null, model.base_model), h("td", null, h("span", {class: `badge stage-${model.stage}`}, model.stage)),
          h("td", null, gateSummary(model)),
          h("td", null, model.job_id ? h("a", {href: href("jobs", model.job_id)}, model.job_id) : "—"),
          h("td", null, formatTime(model.created)))))))
      : h("p", {class: "muted"}, "No fine-tuned models yet: a job that succeeds registers its model here.")),
    section("Base models", table("Base models", ["Model", "SHA-256", "Registered"],
      bases.map((m) => [m.id, h("span", {class: "mono wrap"}, m.sha256 || "—"), formatTime(m.created)]), {hideCaption: true})));
}

function lineageFacts(lineage) {
  if (!lineage) return h("p", {class: "muted"}, "No lineage recorded.");
  const base = lineage.base_model || {};
  const training = lineage.training_file || {};
  const parent = lineage.parent;
  return [
    facts([
      ["Base model", base.name ? `${base.name} (${(base.sha256 || "").slice(0, 12)}…)` : "—"],
      ["Parent", parent ? `${parent.model || ""}${parent.step !== undefined && parent.step !== null ? ` at step ${parent.step}` : ""}` : "—"],
      ["Training file", training.id ? h("a", {href: href("files", training.id)}, `${training.filename || training.id}`) : "—"],
      ["Validation file", lineage.validation_file ? formatValue(lineage.validation_file.filename || lineage.validation_file.id) : "—"],
      ["Dataset", lineage.dataset_id || "—"],
      ["Job", lineage.job_id ? h("a", {href: href("jobs", lineage.job_id)}, lineage.job_id) : "—"],
      ["Method", `${lineage.method || "—"} · ${lineage.training_type || "—"}`],
      ["Attempts", formatValue(lineage.attempts)], ["Trained tokens", formatValue(lineage.trained_tokens)],
      ["Seed", formatValue(lineage.seed)], ["Checkpoint step", formatValue(lineage.checkpoint_step)],
      ["Config hash", h("span", {class: "mono wrap"}, lineage.config_hash || "—")],
      ["Code version", lineage.code_version || "—"],
    ], {"data-testid": "lineage"}),
    lineage.hyperparameters ? h("details", null, h("summary", null, "Hyperparameters"),
      facts(Object.entries(lineage.hyperparameters).map(([k, v]) => [k, formatValue(v)]))) : null,
  ];
}

// The same gates against the lineage's production model (registry/champion.py).
function championSection(verdict) {
  if (!verdict) return h("p", {class: "muted"}, "Not compared: the model was not evaluated, or was registered before this comparison existed.");
  const head = verdict.model
    ? h("p", {"data-testid": "champion-verdict"}, verdict.passed ? "✓ " : "✗ ", "Against ",
      h("a", {href: href("models", verdict.model)}, verdict.model), `: ${verdict.reason}`)
    : h("p", {class: "muted", "data-testid": "champion-verdict"}, "No model of this lineage is in production: nothing to compare with.");
  const rows = (verdict.comparisons || []).map((c) => [c.metric, formatValue(c.champion), formatValue(c.challenger),
    formatValue(c.difference), `${c.op} ${formatValue(c.allowed)}`,
    c.compared ? (c.passed ? "✓ Passed" : "✗ Failed") : "not compared", c.reason]);
  return [head, rows.length ? h("div", {class: "table-wrap"}, table("Production model vs this model",
    ["Metric", "Production", "This model", "Difference", "Allowed", "Verdict", "Why"], rows, {testid: "champion-table", hideCaption: true})) : null];
}

export async function modelView(main, params) {
  const modelId = params.modelId;
  const path = `/v1/models/${encodeURIComponent(modelId)}`;
  let model = await get(path);
  if (model.type !== "fine-tuned") {
    fill(main, h("h1", null, "Model ", h("span", {class: "mono"}, model.id)),
      facts([["Type", "base model"], ["SHA-256", model.sha256 || "—"], ["Registered", formatTime(model.created)]]));
    return;
  }
  const stageSlot = h("span", {"data-testid": "model-stage"});
  const promotableSlot = h("span", {"data-testid": "model-promotable"});
  const history = h("div", {"data-testid": "stage-history"});
  const stageSelect = dropdown(STAGES.map((stage) => [stage, stage]), {name: "stage"});
  const promote = h("button", {type: "button"}, "Move to stage");
  const promoteError = h("p", {class: "form-error", role: "alert", hidden: true});

  function drawModel() {
    fill(stageSlot, h("span", {class: `badge stage-${model.stage}`}, model.stage));
    promotableSlot.textContent = model.promotable ? "yes: its gates passed"
      : model.evaluated === false ? "no: it was not evaluated, so it stays in dev"
      : "no: staging and production need passing gates";
    stageSelect.value = model.stage === "dev" ? "staging" : model.stage;
  }

  async function drawHistory() {
    const changes = (await get(`${path}/stages`)).data;
    fill(history, changes.length
      ? table("Stage history", ["When", "From", "To", "By", "Override", "Reason"], changes.map((change) => [
        formatTime(change.created_at), change.from_stage || "—", change.to_stage, change.actor,
        change.override ? "yes" : "no", change.reason || "—"]), {testid: "stage-table", hideCaption: true})
      : h("p", {class: "muted"}, "No moves yet."));
  }

  promote.addEventListener("click", () => busy(promote, async () => {
    promoteError.hidden = true;
    try {
      model = await post(`${path}/promote`, {stage: stageSelect.value});
    } catch (error) {
      promoteError.textContent = error.message;
      promoteError.hidden = false;
      return;
    }
    drawModel();
    await drawHistory();
    announce(`${model.id} is now in ${model.stage}.`, {from: promote});
  }));

  drawModel();
  const report = {gates: model.gates || [], suggestions: model.suggestions || [],
    passed: (model.gate_failures || []).length === 0};
  fill(main,
    h("h1", null, "Model ", h("span", {class: "mono wrap"}, model.id)),
    facts([["Stage", stageSlot], ["Promotable", promotableSlot], ["Base model", model.base_model],
      ["Artifact", model.artifact], ["Job", model.job_id ? h("a", {href: href("jobs", model.job_id)}, model.job_id) : "—"],
      ["Created", formatTime(model.created)]]),
    section("Promotion",
      h("div", {class: "row", "aria-live": "polite"}, field("Stage", stageSelect, "dev, staging, production or archived; staging and production only for evaluated models whose gates passed and that are not worse than the production model."), promote),
      promoteError, h("h3", null, "Stage history"), history),
    section("Eval results: base model vs this model", h("div", {"data-testid": "eval-results"}, ...evalResults(model.eval_results, report))),
    section("Against production: the production model vs this model", h("div", {"data-testid": "champion"}, ...[championSection(model.champion)].flat())),
    section("Lineage", ...[lineageFacts(model.lineage)].flat()),
    section("Try it", h("p", null, h("a", {href: `#/playground?model=${encodeURIComponent(model.id)}`}, "Compare it with its base model in the playground"))));
  await drawHistory();
}
