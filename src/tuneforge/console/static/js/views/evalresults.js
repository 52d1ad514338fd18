// Eval results as jobs and models show them: base and fine-tuned figures side by side,
// every gate with its verdict (in words, not only colour) and reason, and the suggestions
// the platform made when a gate failed.

import {h, formatNumber} from "../dom.js";

function condition(gate) {
  const subject = gate.relative_to_base ? `${gate.metric} (fine-tuned − base)` : gate.metric;
  return `${subject} ${gate.op} ${formatNumber(gate.threshold)}`;
}

function figuresTable(results) {
  const base = results.base || {};
  const tuned = results.fine_tuned || {};
  const metrics = [...new Set([...Object.keys(base), ...Object.keys(tuned)])].sort();
  if (!metrics.length) return h("p", {class: "muted"}, "No figures were measured.");
  return h("div", {class: "table-wrap"}, h("table", {class: "grid", "data-testid": "eval-figures"},
    h("caption", null, "Figures"),
    h("thead", null, h("tr", null, ["Metric", "Base", "Fine-tuned", "Change"].map((t) => h("th", {scope: "col"}, t)))),
    h("tbody", null, metrics.map((metric) => {
      const a = base[metric];
      const b = tuned[metric];
      const change = typeof a === "number" && typeof b === "number" ? b - a : null;
      return h("tr", {"data-metric": metric},
        h("th", {scope: "row"}, metric), h("td", null, formatNumber(a)), h("td", null, formatNumber(b)),
        h("td", null, change === null ? "—" : `${change >= 0 ? "+" : ""}${formatNumber(change)}`));
    }))));
}

function gatesTable(gates) {
  if (!gates || !gates.length) return h("p", {class: "muted"}, "No gates were checked.");
  return h("div", {class: "table-wrap"}, h("table", {class: "grid", "data-testid": "eval-gates"},
    h("caption", null, "Gates"),
    h("thead", null, h("tr", null, ["Condition", "Value", "Verdict", "Reason"].map((t) => h("th", {scope: "col"}, t)))),
    h("tbody", null, gates.map((gate) => h("tr", {"data-gate": gate.metric, "data-passed": String(!!gate.passed)},
      h("td", null, condition(gate)),
      h("td", null, formatNumber(gate.value)),
      h("td", null, h("span", {class: `verdict ${gate.passed ? "pass" : "fail"}`},
        gate.passed ? "✓ Passed" : "✗ Failed")),
      h("td", {class: "wrap"}, gate.reason || "—"))))));
}

function samplesBlock(samples) {
  const task = (samples && samples.task) || [];
  if (!task.length) return null;
  return h("details", {class: "samples"}, h("summary", null, `Sample answers (${task.length})`),
    h("div", {class: "table-wrap"}, h("table", {class: "grid"},
      h("caption", {class: "visually-hidden"}, "Sample answers of the base and the fine-tuned model"),
      h("thead", null, h("tr", null, ["Prompt", "Reference", "Base", "Fine-tuned"].map((t) => h("th", {scope: "col"}, t)))),
      h("tbody", null, task.map((sample) => h("tr", null,
        [sample.prompt, sample.reference, sample.base, sample.fine_tuned].map((text) => h("td", {class: "wrap pre"}, text ?? "—"))))))));
}

/**
 * The eval panel's content. `results`: eval_results (base, fine_tuned, samples, errors);
 * `report`: {passed, gates, suggestions} — the job's `eval_results.gates`, or a model's
 * `gates` and `suggestions`.
 */
export function evalResults(results, report) {
  if (!results) return [h("p", {class: "muted", "data-testid": "eval-pending"}, "No eval results yet.")];
  const gates = (report && report.gates) || [];
  const failed = gates.filter((gate) => !gate.passed);
  const passed = report && typeof report.passed === "boolean" ? report.passed : failed.length === 0;
  const verdict = !gates.length ? "No gates were checked." : passed
    ? `All ${gates.length} gate${gates.length === 1 ? "" : "s"} passed: the model can be promoted.`
    : `${failed.length} of ${gates.length} gate${gates.length === 1 ? "" : "s"} failed: the model cannot be promoted to staging or production.`;
  const suggestions = (report && report.suggestions) || [];
  const errors = results.errors || [];
  return [
    h("p", {class: `verdict-line ${passed ? "pass" : "fail"}`, "data-testid": "eval-verdict"}, verdict),
    figuresTable(results),
    gatesTable(gates),
    suggestions.length ? h("div", {class: "suggestions", "data-testid": "eval-suggestions"},
      h("h3", null, "Suggestions"), h("ul", null, suggestions.map((text) => h("li", null, typeof text === "string" ? text : JSON.stringify(text))))) : null,
    errors.length ? h("div", {class: "eval-errors"}, h("h3", null, "Errors during the eval"),
      h("ul", null, errors.map((error) => h("li", null, typeof error === "string" ? error : JSON.stringify(error))))) : null,
    samplesBlock(results.samples),
  ];
}
