// The jobs list: newest first, a page at a time (`after` = the last job's id), filtered by
// metadata on the server (`metadata[k]=v`) and by status in the page.

import {get} from "../api.js";
import {h, fill, field, dropdown, formatTime, statusBadge} from "../dom.js";
import {href} from "../router.js";
import {announce, busy} from "../ui.js";
import {parseMetadata} from "./jobfields.js";

export const STATUSES = ["validating_files", "queued", "running", "evaluating", "pausing", "paused", "succeeded",
  "failed", "cancelled"];
const PAGE_SIZE = 20;

/** "team=nlp, run=3" → {"metadata[team]": "nlp", "metadata[run]": "3"}; throws on a malformed pair. */
export function metadataQuery(text) {
  const pairs = parseMetadata(text) || {};
  return Object.fromEntries(Object.entries(pairs).map(([key, value]) => [`metadata[${key}]`, value]));
}

function jobRow(job) {
  const status = job.precise_status || job.status;
  return h("tr", {"data-job": job.id, "data-status": status},
    h("td", null, h("a", {href: href("jobs", job.id)}, job.id)),
    h("td", null, job.model),
    h("td", null, statusBadge(status)),
    h("td", null, formatTime(job.created_at)),
    h("td", {class: "wrap"}, job.fine_tuned_model || "—"),
    h("td", {class: "wrap"}, Object.entries(job.metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"));
}

export async function jobsView(main, _params, query) {
  const statusFilter = dropdown([["", "Any status"], ...STATUSES.map((value) => [value, value])],
    {name: "status", value: query.get("status") || ""});
  const metadataFilter = h("input", {type: "text", name: "metadata", value: query.get("metadata") || "",
    placeholder: "team=nlp, run=3"});
  const applyButton = h("button", {type: "submit"}, "Apply filters");
  const filterError = h("p", {class: "form-error", role: "alert", hidden: true});
  const filters = h("form", {class: "filters", "aria-label": "Filter jobs"},
    field("Status", statusFilter),
    field("Metadata", metadataFilter, "key=value pairs, separated by commas; every pair must match."),
    applyButton, filterError);
  const body = h("tbody");
  const summary = h("p", {class: "muted", "aria-live": "polite", "data-testid": "jobs-summary"});
  const more = h("button", {type: "button", class: "secondary", hidden: true}, "Load more jobs");
  const jobs = [];
  let after = null;
  let serverQuery = {};

  function shown() {
    const wanted = statusFilter.value;
    return jobs.filter((job) => !wanted || (job.precise_status || job.status) === wanted)
      .sort((a, b) => b.created_at - a.created_at);
  }

  function draw() {
    const rows = shown();
    fill(body, rows.length ? rows.map(jobRow) : h("tr", null, h("td", {colspan: 6, class: "muted"}, "No jobs match.")));
    summary.textContent = `${rows.length} job${rows.length === 1 ? "" : "s"} shown of ${jobs.length} loaded.`;
  }

  async function loadPage() {
    const page = await get("/v1/fine_tuning/jobs", {...serverQuery, limit: PAGE_SIZE, after});
    jobs.push(...page.data);
    after = page.data.length ? page.data[page.data.length - 1].id : after;
    more.hidden = !page.has_more;
    draw();
  }

  filters.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      serverQuery = metadataQuery(metadataFilter.value);
      filterError.hidden = true;
    } catch (error) {
      filterError.textContent = `Metadata filter: ${error.message.replace(/^metadata: /, "")}`;
      filterError.hidden = false;
      return;
    }
    jobs.length = 0;
    after = null;
    await busy(applyButton, loadPage);
    announce(summary.textContent);
  });
  statusFilter.addEventListener("change", () => { draw(); announce(summary.textContent); });
  more.addEventListener("click", () => busy(more, loadPage));

  try {
    serverQuery = metadataQuery(metadataFilter.value);
  } catch {
    serverQuery = {};
  }
  await loadPage();
  fill(main,
    h("div", {class: "page-head"}, h("h1", null, "Fine-tuning jobs"), h("a", {class: "button", href: "#/jobs/new"}, "New job")),
    filters,
    summary,
    h("div", {class: "table-wrap"}, h("table", {class: "grid", "data-testid": "jobs-table"},
      h("caption", {class: "visually-hidden"}, "Fine-tuning jobs, newest first"),
      h("thead", null, h("tr", null, ["Job", "Base model", "Status", "Created", "Fine-tuned model", "Metadata"]
        .map((text) => h("th", {scope: "col"}, text)))),
      body)),
    more);
}
