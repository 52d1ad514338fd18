// One job: status and controls, live charts fed by the job's event stream, the event list,
// eval results, checkpoints with downloads, and attempts.

import {ApiError, download, followJobEvents, get, post} from "../api.js";
import {LineChart, smoothingControl} from "../chart.js";
import {h, fill, facts, formatNumber, formatTime, formatValue, section, statusBadge, table} from "../dom.js";
import {href} from "../router.js";
import {announce, busy, showError, statusSentence} from "../ui.js";
import {evalResults} from "./evalresults.js";
import {EVENTS_PAGE_SIZE, eventsPanel} from "./jobevents.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

const CHARTS = [
  ["loss", "Loss", [{key: "train_loss", label: "Train loss"}, {key: "valid_loss", label: "Validation loss", dashed: true}]],
  ["learning_rate", "Learning rate", [{key: "learning_rate", label: "Learning rate"}]],
  ["grad_norm", "Gradient norm", [{key: "grad_norm", label: "Gradient norm"}]],
  ["tokens_per_second", "Tokens per second", [{key: "tokens_per_second", label: "Tokens per second"}]],
];
// What NVML says of the job's GPU (absent on a CPU host): each chart made when its first figure comes.
const GPU_CHARTS = [
  ["gpu_utilization", "GPU utilisation", [{key: "gpu_utilization", label: "Busy share (0-1)"}]],
  ["gpu_memory", "GPU memory (MiB)", [{key: "gpu_memory_used_mb", label: "Used"},
    {key: "gpu_memory_peak_mb", label: "Peak", dashed: true}]],
  ["gpu_power", "GPU power (W)", [{key: "gpu_power_w", label: "Power"}]],
  ["gpu_temperature", "GPU temperature (°C)", [{key: "gpu_temperature_c", label: "Temperature"}]],
];
// The trainer's own figures of a step that have no chart of their own. Any other number in a
// metrics event is one a training method reports of its own: it gets a chart named after it.
const NOT_CHARTED = new Set(["step", "total_steps", "train_mean_token_accuracy", "valid_mean_token_accuracy",
  "padding_fraction", "peak_memory_mb", "mfu",
  ...[...CHARTS, ...GPU_CHARTS].flatMap(([, , series]) => series.map(({key}) => key))]);

/** "rollout_mean_length" → "Rollout mean length". */
function metricTitle(key) {
  const words = key.replace(/_/g, " ");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

function artifactKind(job) {
  return job.training_type && job.training_type.type === "full" ? "model" : "adapter";
}

function hyperparameterTable(job) {
  const method = job.method || {};
  const hp = (method[method.type] || {}).hyperparameters || job.hyperparameters || {};
  const rows = Object.entries(hp).map(([name, value]) => [name, formatValue(value)]);
  const adapter = Object.entries(job.training_type || {}).map(([name, value]) => [`training_type.${name}`, formatValue(value)]);
  return table("Hyperparameters (resolved once the files are validated)", ["Name", "Value"], [...rows, ...adapter],
    {testid: "hyperparameters"});
}

export async function jobView(main, params, _query, view) {
  const jobId = params.jobId;
  let job = await get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}`);
  if (!view.isCurrent()) return;

  const statusSlot = h("span", {"data-testid": "job-status"});
  const progress = h("progress", {max: 1, value: 0, "aria-label": "Training progress"});
  const progressText = h("span", {class: "muted", "data-testid": "job-progress"}, "No steps yet");
  const overview = h("div");
  const hyperparameters = h("div");
  const evalPanel = h("div", {"data-testid": "eval-results"});
  const checkpoints = h("div", {"data-testid": "checkpoints"});
  const attempts = h("div", {"data-testid": "attempts"});
  const events = eventsPanel(jobId);
  const streamState = h("span", {class: "muted", "data-testid": "stream-state"}, "Connecting to the event stream…");
  const charts = Object.fromEntries(CHARTS.map(([name, title, series]) => [name, new LineChart(name, title, series)]));
  const chartBox = h("div", {class: "charts", "data-testid": "charts"}, CHARTS.map(([name]) => charts[name].element));
  let smoothing = 0;
  const smoothingTool = smoothingControl((weight) => {
    smoothing = weight;
    for (const chart of Object.values(charts)) chart.setSmoothing(weight);
  });
  let currentStatus = job.precise_status || job.status;

  const pauseButton = h("button", {type: "button", class: "secondary"}, "Pause");
  const resumeButton = h("button", {type: "button", class: "secondary"}, "Resume");
  const cancelButton = h("button", {type: "button", class: "danger"}, "Cancel job");
  const confirmYes = h("button", {type: "button", class: "danger"}, "Yes, cancel the job");
  const confirmNo = h("button", {type: "button", class: "secondary"}, "Keep it");
  const confirmBox = h("div", {class: "confirm", role: "group", "aria-label": "Confirm cancelling", hidden: true},
    h("span", null, "Cancel this job? Its checkpoints are removed unless it keeps them on cancel."), confirmYes, confirmNo);

  // The stream replays the job's past events before the live ones: past status changes are
  // shown but not announced. The newest event when the page opened marks where live begins;
  // the events panel has the ones up to it from the paged list, and takes the stream's after it.
  let live = false;
  let newestAtOpen = null;
  let pastOpen = false;

  function setStatus(status, {say = true} = {}) {
    if (!status) return;
    const changed = status !== currentStatus;
    currentStatus = status;
    fill(statusSlot, statusBadge(status));
    pauseButton.disabled = !["queued", "running", "validating_files"].includes(status);
    resumeButton.disabled = status !== "paused";
    cancelButton.disabled = TERMINAL.has(status);
    if (changed && say) announce(statusSentence(`Job ${jobId}`, status));
  }

  function drawJob() {
    const est = job.estimate || {};
    fill(overview, facts([
      ["Base model", job.model],
      ["Fine-tuned model", job.fine_tuned_model ? h("a", {href: href("models", job.fine_tuned_model)}, job.fine_tuned_model) : "—"],
      ["Method", `${(job.method || {}).type || "supervised"} · ${(job.training_type || {}).type || "lora"}`],
      ["Training file", h("a", {href: href("files", job.training_file)}, job.training_file)],
      ["Validation file", job.validation_file ? h("a", {href: href("files", job.validation_file)}, job.validation_file) : "—"],
      ["Created", formatTime(job.created_at)],
      ["Finished", formatTime(job.finished_at)],
      ["Attempt", String(job.attempt ?? "—")],
      ["Trained tokens", formatNumber(job.trained_tokens)],
      ["Estimate", est.steps ? `${formatNumber(est.steps)} steps · ${formatNumber(est.estimated_gpu_hours)} GPU-hours · ${formatNumber(est.estimated_price)} ${est.currency || ""}` : "—"],
      ["Metadata", Object.entries(job.metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"],
      ["Error", job.error && job.error.message ? h("span", {class: "form-error"}, job.error.message) : "—"],
    ], {"data-testid": "job-overview"}));
    fill(hyperparameters, hyperparameterTable(job));
    const results = job.eval_results;
    fill(evalPanel, ...evalResults(results, results && results.gates));
    setStatus(job.precise_status || job.status, {say: false});
  }

  async function refreshJob() {
    job = await get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}`);
    if (view.isCurrent()) drawJob();
  }

  async function refreshCheckpoints() {
    const page = await get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/checkpoints`, {limit: 100});
    if (!view.isCurrent()) return;
    const kind = artifactKind(job);
    const rows = page.data.map((checkpoint) => {
      const metrics = checkpoint.metrics || {};
      const button = h("button", {type: "button", class: "secondary small", "data-step": checkpoint.step_number,
        "aria-label": `Download the ${kind} of step ${checkpoint.step_number}`}, "Download");
      button.addEventListener("click", () => busy(button, async () => {
        const saved = await download(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/download`,
          {artifact: kind, step: checkpoint.step_number}, `${jobId}-step-${checkpoint.step_number}.tar.gz`);
        announce(`Downloaded ${saved.name} (${formatNumber(saved.size)} bytes).`, {from: button});
      }));
      return [String(checkpoint.step_number), checkpoint.epoch ?? "—", formatNumber(metrics.train_loss),
        formatNumber(metrics.valid_loss ?? metrics.full_valid_loss), h("span", {class: "wrap"}, checkpoint.fine_tuned_model_checkpoint), button];
    });
    const finalButton = job.status === "succeeded" ? h("button", {type: "button", class: "small"}, `Download the final ${kind}`) : null;
    if (finalButton) {
      finalButton.addEventListener("click", () => busy(finalButton, async () => {
        const saved = await download(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/download`, {artifact: kind},
          `${jobId}-${kind}.tar.gz`);
        announce(`Downloaded ${saved.name} (${formatNumber(saved.size)} bytes).`, {from: finalButton});
      }));
    }
    fill(checkpoints, finalButton, rows.length
      ? h("div", {class: "table-wrap"}, table("Checkpoints, newest first", ["Step", "Epoch", "Train loss", "Validation loss", "Name", "Artifact"], rows, {hideCaption: true}))
      : h("p", {class: "muted"}, "No checkpoints yet."));
  }

  async function refreshAttempts() {
    const page = await get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/attempts`);
    if (!view.isCurrent()) return;
    const rows = page.data.map((attempt) => [String(attempt.number), attempt.status, attempt.failure_class || "—",
      attempt.exit_code ?? "—", String(attempt.gpus ?? "—"), attempt.pool || "—", formatNumber(attempt.cost),
      formatTime(attempt.started_at), formatTime(attempt.ended_at)]);
    const cost = page.cost || {};
    fill(attempts, rows.length
      ? [h("p", {"data-testid": "job-cost"}, `Cost so far ${formatNumber(cost.so_far)}; on demand it would be ${formatNumber(cost.on_demand)} (saving ${formatNumber(cost.saving)}).`),
        h("div", {class: "table-wrap"}, table("Attempts", ["#", "Status", "Failure class", "Exit code", "GPUs", "Pool", "Cost", "Started", "Ended"], rows, {hideCaption: true}))]
      : h("p", {class: "muted"}, "Not started yet."));
  }

  let refreshTimer = null;
  function refreshSoon() {
    window.clearTimeout(refreshTimer);
    refreshTimer = window.setTimeout(() => {
      Promise.all([refreshJob(), refreshCheckpoints(), refreshAttempts()]).catch(showError);
    }, 250);
  }

  function onEvents(streamed) {
    if (!view.isCurrent()) return;
    const touched = new Set();
    const newer = [];
    let sawStatus = false;
    for (const event of streamed) {
      const data = event.data || {};
      if (event.type === "metrics" && typeof data.step === "number") {
        for (const [name, , series] of CHARTS) {
          for (const {key} of series) {
            if (charts[name].add(key, data.step, data[key])) touched.add(name);
          }
        }
        for (const [name, title, series] of GPU_CHARTS) {
          if (!series.some(({key}) => typeof data[key] === "number")) continue;
          if (!charts[name]) {
            charts[name] = new LineChart(name, title, series);
            charts[name].weight = smoothing;
            chartBox.append(charts[name].element);
          }
          for (const {key} of series) {
            if (charts[name].add(key, data.step, data[key])) touched.add(name);
          }
        }
        for (const [key, value] of Object.entries(data)) {
          if (NOT_CHARTED.has(key) || typeof value !== "number" || !Number.isFinite(value)) continue;
          // a method's `valid_X` is the validation figure of its `X`: a dashed line in X's chart
          const figure = key.startsWith("valid_") ? key.slice("valid_".length) : key;
          const name = `own:${figure}`;  // (apart from the fixed charts' names, whatever the method calls it)
          if (!charts[name]) {
            charts[name] = new LineChart(figure, metricTitle(figure), [{key: figure, label: metricTitle(figure)}]);
            charts[name].weight = smoothing;
            chartBox.append(charts[name].element);
          }
          if (key !== figure) charts[name].addSeries({key, label: `Validation ${metricTitle(figure).toLowerCase()}`, dashed: true});
          if (charts[name].add(key, data.step, value)) touched.add(name);
        }
        if (data.total_steps) {
          progress.max = data.total_steps;
          progress.value = data.step;
          progressText.textContent = `Step ${data.step} of ${data.total_steps}`;
        }
      }
      if (data.status) {
        setStatus(data.status, {say: live});
        sawStatus = true;
      }
      if (!live && (newestAtOpen === null || event.id === newestAtOpen)) live = true;
      if (data.checkpoint || data.fine_tuned_model || data.gates || data.eval) sawStatus = true;
      if (pastOpen) newer.push(event);
      else if (event.id === newestAtOpen) pastOpen = true;
    }
    if (newer.length) events.addLive(newer);
    for (const name of touched) charts[name].render();
    if (sawStatus) refreshSoon();
  }

  /** `button` posts `action` (pause, resume, cancel); the buttons then follow the new status. */
  function control(button, action, after = () => {}) {
    button.addEventListener("click", async () => {
      await busy(button, async () => {
        job = await post(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/${action}`);
        after();
        drawJob();
        announce(statusSentence(`Job ${jobId}`, job.precise_status || job.status));
      });
      setStatus(currentStatus, {say: false});  // busy() re-enabled the button whatever the status
    });
  }

  control(pauseButton, "pause");
  control(resumeButton, "resume");
  cancelButton.addEventListener("click", () => {
    confirmBox.hidden = false;
    confirmYes.focus();
  });
  confirmNo.addEventListener("click", () => {
    confirmBox.hidden = true;
    cancelButton.focus();
  });
  control(confirmYes, "cancel", () => {
    confirmBox.hidden = true;
    main.querySelector("h1").focus();  // the focused button is gone: focus goes back to the page's heading
  });

  drawJob();
  fill(main,
    h("div", {class: "page-head"},
      h("h1", null, "Job ", h("span", {class: "mono"}, jobId)),
      h("div", {class: "status-line", "aria-live": "polite"}, "Status: ", statusSlot),
      h("div", {class: "actions"}, pauseButton, resumeButton, cancelButton)),
    confirmBox,
    h("div", {class: "progress-line"}, progress, progressText, streamState),
    section("Training metrics", smoothingTool, chartBox),
    h("div", {class: "two-col"}, section("Overview", overview), section("Hyperparameters", hyperparameters)),
    section("Eval results", evalPanel),
    h("div", {class: "two-col"}, section("Checkpoints", checkpoints), section("Attempts", attempts)),
    section("Events", events.element));
  events.older.addEventListener("click", () => busy(events.older, events.loadOlder));

  // The page and its controls are drawn: a panel that fails to load now (a busy server's 429, a
  // dropped connection) says so in the banner and fills in at the next refresh; it does not
  // replace the page. A key that stopped working still signs the console out (app.js).
  try {
    const [newest] = await Promise.all([
      get(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/events`, {limit: EVENTS_PAGE_SIZE}),
      refreshCheckpoints(), refreshAttempts()]);
    newestAtOpen = newest.data.length ? newest.data[0].id : null;
    if (view.isCurrent()) events.addPage(newest);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) throw error;
    if (view.isCurrent()) showError(error);
  }
  if (!view.isCurrent()) return;
  // with no newest event (none yet, or the page failed), every event the stream brings is new
  pastOpen = newestAtOpen === null;
  const stop = followJobEvents(jobId, {
    onEvents: (events) => {
      streamState.textContent = "Live";
      onEvents(events);
    },
    onEnd: (finished) => {
      if (!view.isCurrent()) return;
      streamState.textContent = finished ? "The job has finished; every event is shown." : "The event stream stopped.";
      streamState.dataset.finished = String(finished);
      refreshSoon();
    },
    onError: showError,
  });
  view.onLeave(stop);
  view.onLeave(() => window.clearTimeout(refreshTimer));
}
