// Hyperparameter sweeps: the tenant's sweeps, and a sweep's trials (parameters, status, the
// validation loss at each early-stopping rung, objective, GPU time) with its best trial.

import {get, post} from "../api.js";
import {h, fill, facts, formatNumber, formatTime, section, table} from "../dom.js";
import {href} from "../router.js";
import {announce, busy, inlineError, statusSentence} from "../ui.js";

const RUNNING = "running";

function params(trial) {
  return Object.entries(trial.params).map(([name, value]) => `${name}=${formatNumber(value)}`).join(", ");
}

export async function sweepsView(main) {
  const sweeps = (await get("/v1/fine_tuning/sweeps")).data;
  fill(main, h("h1", null, "Sweeps"),
    h("p", {class: "muted"}, "A sweep trains one job over a search space, stops weak trials early and reports the best. ",
      "Create one with ", h("code", null, "tuneforge sweeps create -f sweep.yaml"), " or POST /v1/fine_tuning/sweeps."),
    section("Your sweeps", sweeps.length
      ? h("div", {class: "table-wrap"}, table("Your sweeps", ["Sweep", "Status", "Trials", "Stopped early", "Best", "Created"],
        sweeps.map((sweep) => [h("a", {href: href("sweeps", sweep.id)}, sweep.id), sweep.status,
          `${sweep.trials.length} / ${sweep.max_trials}`, String(sweep.stopped_early),
          sweep.best_trial ? formatNumber(sweep.best_trial.objective) : "—", formatTime(sweep.created_at)]),
        {hideCaption: true, testid: "sweeps-table"}))
      : h("p", {class: "muted"}, "No sweeps yet.")));
}

export async function sweepView(main, routeParams) {
  const path = `/v1/fine_tuning/sweeps/${encodeURIComponent(routeParams.sweepId)}`;
  let sweep = await get(path);
  const summary = h("div", {"data-testid": "sweep-summary"});
  const trials = h("div", {"data-testid": "sweep-trials"});
  const cancel = h("button", {type: "button", class: "danger"}, "Cancel sweep");
  const promote = h("button", {type: "button"}, "Promote the best to staging");
  const actionError = h("p", {class: "form-error", role: "alert", hidden: true});

  function draw() {
    const best = sweep.best_trial;
    fill(summary, facts([
      ["Status", h("span", {class: `badge status-${sweep.status}`, "data-testid": "sweep-status"}, sweep.status)],
      ["Objective", `${sweep.objective.goal} ${sweep.objective.metric}`],
      ["Sampler", `${sweep.sampler}, ${sweep.max_trials} trials, ${sweep.max_parallel} at a time`],
      ["Early stopping", sweep.early_stopping ? `ASHA, from epoch ${sweep.early_stopping.min_epochs}, eta ${sweep.early_stopping.eta}` : "none"],
      ["Stopped early", String(sweep.stopped_early)], ["GPU-seconds", formatNumber(sweep.gpu_seconds)],
      ["Best trial", best ? `${best.number}: ${params(best)} → ${formatNumber(best.objective)}` : "—"],
      ["Created", formatTime(sweep.created_at)],
    ]));
    fill(trials, sweep.trials.length
      ? h("div", {class: "table-wrap"}, table("Trials", ["Trial", "Parameters", "Status", "Rungs", "Objective", "GPU-s", "Job"],
        sweep.trials.map((trial) => [String(trial.number), params(trial), trial.status,
          trial.rungs.map((value) => formatNumber(value)).join(" → ") || "—", formatNumber(trial.objective),
          formatNumber(trial.gpu_seconds), trial.job_id ? h("a", {href: href("jobs", trial.job_id)}, trial.job_id) : "—"]),
        {hideCaption: true, testid: "trials-table"}))
      : h("p", {class: "muted"}, "No trial has started yet."));
    cancel.disabled = sweep.status !== RUNNING;
    promote.disabled = !(sweep.status === "succeeded" && best && best.fine_tuned_model);
  }

  async function act(button, url, body, done) {
    const message = await busy(button, async () => {
      actionError.hidden = true;
      try {
        const answer = await post(url, body);
        sweep = await get(path);
        return done(answer);
      } catch (error) {
        inlineError(actionError, error);
        return null;
      }
    });
    draw();  // after busy() has given the button back: the sweep's state decides what is enabled
    if (message) announce(message, {from: button});
  }
  cancel.addEventListener("click", () => act(cancel, `${path}/cancel`, {}, () => statusSentence(`Sweep ${sweep.id}`, sweep.status)));
  promote.addEventListener("click", () => act(promote, `${path}/promote`, {stage: "staging"},
    (model) => `${model.id} is now in ${model.stage}.`));

  draw();
  fill(main, h("h1", null, "Sweep ", h("span", {class: "mono"}, sweep.id)),
    section("Summary", summary, h("div", {class: "row"}, cancel, promote), actionError),
    section("Trials", trials));
  const timer = setInterval(async () => {
    if (!document.body.contains(trials)) { clearInterval(timer); return; }
    if (sweep.status !== RUNNING) return;
    sweep = await get(path);
    draw();
  }, 2000);
}
