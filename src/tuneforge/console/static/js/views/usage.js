// The tenant's metered GPU time in a month: totals against the allowance and each job.

import {get} from "../api.js";
import {h, fill, facts, field, formatNumber, section, table} from "../dom.js";
import {href} from "../router.js";
import {busy} from "../ui.js";

export function thisMonth() {
  return new Date().toISOString().slice(0, 7);
}

/** A month picker (YYYY-MM) and a Show button; `onShow(month)`. */
export function monthForm(initial, onShow) {
  const month = h("input", {type: "month", name: "month", value: initial, min: "1970-01", max: "9999-12", required: true});
  const show = h("button", {type: "submit"}, "Show");
  const form = h("form", {class: "row", "aria-label": "Choose a month"}, field("Month (UTC)", month, "YYYY-MM"), show);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    busy(show, () => onShow(month.value));
  });
  return form;
}

export async function usageView(main, _params, query) {
  const totalsBox = h("div", {"data-testid": "usage-totals"});
  const jobsBox = h("div", {"data-testid": "usage-jobs"});

  async function show(month) {
    const usage = await get("/v1/usage", {month: month || undefined});
    const totals = usage.totals || {};
    fill(totalsBox, facts([
      ["Month", totals.month],
      ["GPU-hours", formatNumber(totals.gpu_hours)],
      ["Billable GPU-hours", formatNumber(totals.billable_gpu_hours)],
      ["Refunded GPU-hours", `${formatNumber(totals.refunded_gpu_hours)} (platform failures are not billed)`],
      ["Soft allowance", totals.gpu_hours_soft === null ? "none" : `${formatNumber(totals.gpu_hours_soft)} GPU-hours${totals.over_soft_allowance ? " — exceeded" : ""}`],
      ["Hard cap", totals.gpu_hours_hard === null ? "none" : `${formatNumber(totals.gpu_hours_hard)} GPU-hours${totals.hard_cap_reached ? " — reached: new jobs wait for next month" : ""}`],
    ]));
    fill(jobsBox, usage.data.length
      ? h("div", {class: "table-wrap"}, table("GPU time per job", ["Job", "Model", "Status", "GPU-seconds", "Billable", "Refunded", "Attempts"],
        usage.data.map((row) => [h("a", {href: href("jobs", row.job_id)}, row.job_id), row.model, row.status,
          formatNumber(row.gpu_seconds), formatNumber(row.billable_gpu_seconds), formatNumber(row.refunded_gpu_seconds),
          String(row.attempts)])))
      : h("p", {class: "muted"}, "No GPU time in this month."));
  }

  await show(query.get("month") || thisMonth());
  fill(main, h("h1", null, "Usage"), monthForm(query.get("month") || thisMonth(), show),
    section("Totals", totalsBox), section("Jobs", jobsBox));
}
