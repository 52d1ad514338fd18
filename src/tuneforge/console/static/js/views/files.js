// Files and the dataset page: a fine-tune file's validation report (errors by line,
// duplicates, personal data, contamination) and a few examples rendered through a base
// model's chat template with the trained tokens (the loss mask) highlighted.

import {allPages, get, waitProcessed} from "../api.js";
import {h, fill, facts, field, formatNumber, formatTime, formatValue, section, dropdown, table} from "../dom.js";
import {href} from "../router.js";
import {announce, busy, showError} from "../ui.js";
import {uploadControl} from "./upload.js";

export async function filesView(main) {
  const files = await allPages("/v1/files", {limit: 100});
  const body = h("tbody");
  function row(file) {
    return h("tr", {"data-file": file.id},
      h("td", null, h("a", {href: href("files", file.id)}, file.filename)),
      h("td", {class: "mono"}, file.id), h("td", null, file.purpose),
      h("td", null, h("span", {class: `badge status-${file.status}`}, file.status)),
      h("td", null, formatNumber(file.bytes)), h("td", null, formatTime(file.created_at)));
  }
  fill(body, files.length ? files.map(row) : h("tr", null, h("td", {colspan: 6, class: "muted"}, "No files yet.")));
  const upload = uploadControl((file) => {
    if (!files.length) body.replaceChildren();
    files.unshift(file);
    body.prepend(row(file));
  });
  fill(main, h("h1", null, "Files"),
    section("Upload a fine-tuning file", upload),
    h("div", {class: "table-wrap"}, h("table", {class: "grid", "data-testid": "files-table"},
      h("caption", {class: "visually-hidden"}, "Files, newest first"),
      h("thead", null, h("tr", null, ["File", "Id", "Purpose", "Status", "Bytes", "Uploaded"].map((t) => h("th", {scope: "col"}, t)))),
      body)));
}

function issueTable(title, groups, testid) {
  const issues = Object.entries(groups || {}).flatMap(([code, group]) => (group.first || []).map((issue) => [code, issue]))
    .sort(([, a], [, b]) => (a.line || 0) - (b.line || 0));
  const rows = issues.map(([code, issue]) => h("tr", {"data-line": issue.line, "data-code": code},
    h("td", null, issue.line ? String(issue.line) : "whole file"), h("td", {class: "mono"}, code),
    h("td", {class: "mono"}, issue.field || "—"), h("td", {class: "wrap"}, issue.message),
    h("td", {class: "wrap mono"}, issue.excerpt || "—")));
  const counts = Object.entries(groups || {}).map(([code, group]) => `${code}: ${formatNumber(group.count)}`).join(" · ");
  if (!rows.length) return h("p", {class: "muted", "data-testid": testid}, `No ${title.toLowerCase()}.`);
  return h("div", {"data-testid": testid},
    h("p", null, counts, rows.length < Object.values(groups).reduce((n, g) => n + g.count, 0) ? " (the first of each are listed)" : ""),
    h("div", {class: "table-wrap"}, h("table", {class: "grid"}, h("caption", {class: "visually-hidden"}, title),
      h("thead", null, h("tr", null, ["Line", "Code", "Field", "Message", "Excerpt"].map((t) => h("th", {scope: "col"}, t)))),
      h("tbody", null, rows))));
}

function findingsBlock(title, findings, testid) {
  if (!findings) return null;
  const counts = Object.entries(findings.counts || {});
  const samples = findings.first || [];
  return h("div", {class: "finding", "data-testid": testid}, h("h3", null, title),
    h("p", null, counts.length
      ? `${formatNumber(findings.examples_affected)} example(s) affected — ${counts.map(([kind, n]) => `${kind}: ${n}`).join(", ")}` +
        (findings.removed ? `; ${formatNumber(findings.removed)} removed` : "") + (findings.policy ? `; policy: ${findings.policy}` : "")
      : `None found.${findings.policy ? ` Policy: ${findings.policy}.` : ""}`),
    samples.length ? h("div", {class: "table-wrap"}, table(title, ["Line", "Kind", "Details"], samples.map((sample) => {
      const details = Object.entries(sample).filter(([key]) => key !== "line" && key !== "kind")
        .map(([key, value]) => `${key}: ${formatValue(value)}`).join(", ");
      return [String(sample.line), sample.kind, details || "—"];
    }), {hideCaption: true})) : null);
}

function reportPanel(report) {
  const tokens = report.tokens || {};
  return [
    h("p", {class: `verdict-line ${report.ok ? "pass" : "fail"}`, "data-testid": "validation-verdict"},
      report.ok ? "✓ The file passed validation." : "✗ The file did not pass validation: fix the lines below and upload it again."),
    facts([["Format", report.format], ["Kind", report.kind], ["Rows", formatNumber(report.num_rows)],
      ["Examples", formatNumber(report.num_examples)],
      ["Tokens", tokens.count ? `${formatNumber(tokens.total)} in ${formatNumber(tokens.count)} examples (min ${formatNumber(tokens.min)}, max ${formatNumber(tokens.max)})` : "counted when a job validates the file against its base model"]]),
    h("h3", null, "Errors"), issueTable("Errors", report.errors, "validation-errors"),
    h("h3", null, "Warnings"), issueTable("Warnings", report.warnings, "validation-warnings"),
    findingsBlock("Duplicates", report.duplicates, "duplicates"),
    findingsBlock("Personal data", report.pii, "pii"),
    findingsBlock("Contamination with eval sets", report.contamination, "contamination"),
  ];
}

/** One example: its tokens in order, trained ones marked (class and a non-colour underline). */
export function exampleBlock(example) {
  return h("figure", {class: "example", "data-line": example.line},
    h("figcaption", null, `Line ${example.line}: ${formatNumber(example.num_tokens)} tokens, `,
      h("span", {"data-testid": "trained-count"}, formatNumber(example.num_trained_tokens)), " trained",
      example.truncated ? " (truncated to max_seq_length)" : ""),
    h("pre", {class: "tokens", tabindex: "0", "aria-label": `Tokens of line ${example.line}; trained tokens are marked`},
      tokenRuns(example.tokens).map(({trained, tokens}) => trained
        ? h("mark", {class: "trained-run"}, h("span", {class: "visually-hidden"}, "[trained: "),
          tokens.map((token) => h("span", {class: "token trained"}, token.text)), h("span", {class: "visually-hidden"}, "]"))
        : tokens.map((token) => h("span", {class: "token"}, token.text)))));
}

/** Consecutive tokens with the same `trained` flag, grouped (one mark per trained run). */
function tokenRuns(tokens) {
  const runs = [];
  for (const token of tokens) {
    const last = runs[runs.length - 1];
    if (last && last.trained === !!token.trained) last.tokens.push(token);
    else runs.push({trained: !!token.trained, tokens: [token]});
  }
  return runs;
}

async function previewPanel(fileId, panel) {
  const models = await get("/v1/models", {type: "base"});
  const model = dropdown(models.data.map((m) => m.id), {name: "preview-model"});
  const limit = dropdown(["1", "3", "5", "10"], {name: "preview-limit", value: "3"});
  const inputs = h("input", {type: "checkbox", name: "preview-train-on-inputs", id: "preview-train-on-inputs"});
  const show = h("button", {type: "button"}, "Show examples");
  const output = h("div", {class: "preview", "aria-live": "polite", "data-testid": "preview"});
  const legend = h("p", {class: "legend-line"}, h("mark", {class: "trained-run sample"}, "trained token"),
    " — counts towards the loss (highlighted and underlined); ", h("span", {class: "sample"}, "other token"),
    " — context only.");
  show.addEventListener("click", () => busy(show, async () => {
    const preview = await get(`/v1/files/${encodeURIComponent(fileId)}/preview`,
      {model: model.value, limit: limit.value, train_on_inputs: inputs.checked ? "true" : undefined});
    fill(output, preview.examples.length ? preview.examples.map(exampleBlock) : h("p", {class: "muted"}, "No examples to show."));
    const trained = preview.examples.reduce((n, e) => n + e.num_trained_tokens, 0);
    announce(`Showing ${preview.examples.length} examples with ${trained} trained tokens.`, {from: output});
  }));
  fill(panel, h("p", {class: "muted"}, "Examples as the base model's chat template renders them, with the tokens the loss is computed on marked."),
    h("div", {class: "row"}, field("Base model", model), field("Examples", limit),
      h("div", {class: "field checkbox"}, inputs, h("label", {for: inputs.id}, "Train on inputs too (train_on_inputs)")), show),
    legend, output);
  if (models.data.length) show.click();
}

export async function datasetView(main, params) {
  const fileId = params.fileId;
  const file = await get(`/v1/files/${encodeURIComponent(fileId)}`);
  const reportBox = h("div", {"data-testid": "validation-report"});
  const previewBox = h("div");
  fill(main,
    h("div", {class: "page-head"}, h("h1", null, "Dataset ", h("span", {class: "mono"}, file.filename)),
      file.purpose === "fine-tune" && file.status !== "error"
        ? h("a", {class: "button", href: `#/jobs/new?file=${encodeURIComponent(file.id)}`}, "Fine-tune on this file") : null),
    facts([["Id", file.id], ["Purpose", file.purpose], ["Status", h("span", {class: `badge status-${file.status}`}, file.status)],
      ["Bytes", formatNumber(file.bytes)], ["Uploaded", formatTime(file.created_at)],
      ["Status details", file.status_details || "—"]], {"data-testid": "file-facts"}),
    section("Validation report", reportBox),
    section("Examples with the trained tokens", previewBox));
  if (file.purpose !== "fine-tune") {
    fill(reportBox, h("p", {class: "muted"}, "Only fine-tune files have a validation report."));
    fill(previewBox, h("p", {class: "muted"}, "Only fine-tune files are previewed."));
    return;
  }
  if (file.status === "processing") {
    const note = h("p", {class: "muted", "aria-live": "polite", "data-testid": "validation-progress"});
    const show = (current) => {
      const progress = current.validation || {};
      note.textContent = `Validating… ${formatNumber(progress.rows_checked || 0)} rows and ` +
        `${formatNumber(progress.bytes_checked || 0)} of ${formatNumber(progress.bytes_total || current.bytes)} bytes ` +
        `checked (${Math.round(progress.percent || 0)}%).`;
    };
    show(file);
    fill(reportBox, note);
    fill(previewBox, h("p", {class: "muted"}, "The examples are shown once the file is validated."));
    const ended = await waitProcessed(file, show, {stillWanted: () => reportBox.isConnected});
    if (ended) await datasetView(main, params);  // the page again, with the outcome
    return;
  }
  const report = await get(`/v1/files/${encodeURIComponent(fileId)}/validation`);
  fill(reportBox, ...reportPanel(report));
  if (file.status === "error") {
    fill(previewBox, h("p", {class: "muted"}, "The file did not pass validation, so it cannot be previewed."));
    return;
  }
  previewPanel(fileId, previewBox).catch(showError);
}
