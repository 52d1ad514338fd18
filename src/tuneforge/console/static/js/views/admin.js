// The operator's pages (admin key): tenants with their quotas, the whole queue, and
// usage across tenants.

import {get} from "../api.js";
import {h, fill, formatNumber, formatTime, section, table} from "../dom.js";
import {monthForm, thisMonth} from "./usage.js";

function limit(value) {
  return value === null || value === undefined ? "unlimited" : formatNumber(value);
}

export async function tenantsView(main) {
  const tenants = (await get("/v1/admin/tenants")).data;
  fill(main, h("h1", null, "Tenants"),
    h("div", {class: "table-wrap"}, table("Tenants", ["Name", "Id", "Tier", "PII policy", "Concurrent jobs", "Queued jobs",
      "GPU-hours soft", "GPU-hours hard", "Created"], tenants.map((tenant) => {
      const quotas = tenant.quotas || {};
      return [tenant.name, h("span", {class: "mono"}, tenant.id), tenant.tier, tenant.pii_policy,
        limit(quotas.max_concurrent_jobs), limit(quotas.max_queued_jobs), limit(quotas.gpu_hours_soft),
        limit(quotas.gpu_hours_hard), formatTime(tenant.created_at)];
    }), {testid: "tenants-table", hideCaption: true})));
}

export async function queueView(main) {
  const entries = (await get("/v1/admin/queue")).data;
  fill(main, h("h1", null, "Queue"),
    entries.length
      ? h("div", {class: "table-wrap"}, table("Queued jobs in the order they will start", ["Position", "Job", "Tenant", "Tier", "GPUs",
        "Queued", "Estimated start"], entries.map((entry) => [String(entry.position), h("span", {class: "mono"}, entry.job_id),
        h("span", {class: "mono"}, entry.tenant_id), entry.tier, String(entry.gpus), formatTime(entry.queued_at),
        formatTime(entry.estimated_start)]), {testid: "queue-table"}))
      : h("p", {class: "muted", "data-testid": "queue-empty"}, "No job is waiting."));
}

export async function adminUsageView(main, _params, query) {
  const box = h("div", {"data-testid": "admin-usage"});
  async function show(month) {
    const usage = await get("/v1/admin/usage", {month: month || undefined});
    fill(box, h("div", {class: "table-wrap"}, table(`GPU-hours per tenant in ${usage.month}`, ["Tenant", "Tier", "GPU-hours", "Billable",
      "Refunded", "Soft allowance", "Hard cap", "Over soft", "Cap reached"], usage.data.map((row) => [row.tenant, row.tier,
      formatNumber(row.gpu_hours), formatNumber(row.billable_gpu_hours), formatNumber(row.refunded_gpu_hours),
      limit(row.gpu_hours_soft), limit(row.gpu_hours_hard), row.over_soft_allowance ? "yes" : "no",
      row.hard_cap_reached ? "yes" : "no"]))));
  }
  await show(query.get("month") || thisMonth());
  fill(main, h("h1", null, "Usage across tenants"), monthForm(query.get("month") || thisMonth(), show), section("Tenants", box));
}
