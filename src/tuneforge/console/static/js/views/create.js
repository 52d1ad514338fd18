// Creating a job: data (upload with progress, or a file already uploaded), base model,
// method and settings with their defaults and help, the eval, and the estimate, which is
// shown before the job can be created: "Create job" stays off until the estimate on screen
// is the estimate of the body that would be sent.

import {allPages, get, post} from "../api.js";
import {h, fill, field, dropdown, facts, formatNumber, formatValue, section, uid} from "../dom.js";
import {go, href} from "../router.js";
import {announce, busy, clearError} from "../ui.js";
import {ADAPTER_FIELDS, EVAL_METRICS, GATE_OPS, HYPERPARAMETERS, METHOD_OPTIONS, METHODS, TRAINING_TYPES,
  parseMetadata, parseValue} from "./jobfields.js";
import {uploadControl} from "./upload.js";

function settingInput(spec, prefix) {
  const name = `${prefix}.${spec.name}`;
  if (spec.kind === "choice") return dropdown([["", "auto"], ...spec.choices], {name});
  if (spec.kind === "bool") return dropdown([["", "auto"], ["true", "yes"], ["false", "no"]], {name});
  return h("input", {type: "text", inputmode: "decimal", name, placeholder: "auto", autocomplete: "off"});
}

function fileOptions(files) {
  return files.map((file) => [file.id, `${file.filename} · ${file.id}${file.status === "error" ? " (failed validation)" : ""}`]);
}

function gateRow(onRemove) {
  const metric = h("input", {type: "text", name: "gate-metric", value: "task.exact_match", required: true});
  const op = dropdown(GATE_OPS, {name: "gate-op", value: ">="});
  const threshold = h("input", {type: "text", inputmode: "decimal", name: "gate-threshold", value: "0.8"});
  const relative = h("input", {type: "checkbox", name: "gate-relative", id: uid("rel")});
  const remove = h("button", {type: "button", class: "secondary small"}, "Remove gate");
  const row = h("fieldset", {class: "gate-row"}, h("legend", null, "Gate"),
    field("Metric", metric, "A result key: task.exact_match, golden.loss, safety.refusal_rate, validation.loss, …"),
    field("Comparison", op), field("Threshold", threshold),
    h("div", {class: "field checkbox"}, relative, h("label", {for: relative.id}, "Relative to the base (fine-tuned − base)")),
    remove);
  remove.addEventListener("click", () => { row.remove(); onRemove(); });
  row.read = (index) => {
    const value = Number(threshold.value.trim());
    if (!metric.value.trim()) throw new Error(`eval.gates[${index}].metric is required`);
    if (threshold.value.trim() === "" || !Number.isFinite(value)) throw new Error(`eval.gates[${index}].threshold must be a number`);
    return {metric: metric.value.trim(), op: op.value, threshold: value, relative_to_base: relative.checked};
  };
  return row;
}

export async function createJobView(main, _params, query) {
  const [models, files] = await Promise.all([get("/v1/models"), allPages("/v1/files", {limit: 100})]);
  const trainable = files.filter((file) => file.purpose === "fine-tune" && file.status !== "error");
  const taskFiles = files.filter((file) => ["fine-tune", "evals"].includes(file.purpose) && file.status !== "error");
  const bases = models.data.filter((model) => model.type !== "fine-tuned");
  const tuned = models.data.filter((model) => model.type === "fine-tuned");

  // data
  const trainingFile = dropdown([["", "Choose a file…"], ...fileOptions(trainable)], {name: "training_file", required: true});
  const validationFile = dropdown([["", "None (optional split below)"], ...fileOptions(trainable)], {name: "validation_file"});
  if (query.get("file")) trainingFile.value = query.get("file");
  const upload = uploadControl((file) => {
    if (file.status === "error") return;
    for (const list of [trainingFile, validationFile, taskFile]) list.append(h("option", {value: file.id}, `${file.filename} · ${file.id}`));
    trainingFile.value = file.id;
    changed();
  });

  // model and method
  const model = h("select", {name: "model", required: true},
    h("option", {value: ""}, "Choose a model…"),
    h("optgroup", {label: "Base models"}, bases.map((m) => h("option", {value: m.id}, m.id))),
    tuned.length ? h("optgroup", {label: "Continue a fine-tuned model"}, tuned.map((m) => h("option", {value: m.id}, m.id))) : null);
  if (bases.length === 1) model.value = bases[0].id;
  const method = dropdown(METHODS, {name: "method"});
  const trainingType = dropdown(TRAINING_TYPES, {name: "training_type"});
  const adapterInputs = ADAPTER_FIELDS.map((spec) => [spec, settingInput(spec, "training_type")]);
  const hpInputs = HYPERPARAMETERS.map((spec) => [spec, settingInput(spec, "hp")]);
  const optionBox = h("div", {class: "field-grid"});
  let optionInputs = [];
  function drawOptions() {
    const specs = METHOD_OPTIONS[method.value] || [];
    optionInputs = specs.map((spec) => [spec, settingInput(spec, "hp")]);
    fill(optionBox, optionInputs.map(([spec, input]) => field(spec.name, input, spec.help)));
  }
  drawOptions();

  // eval
  const evalMode = dropdown([["default", "The platform's default (as the operator set it: usually the golden and safety sets with the default gates)"],
    ["off", "Off: no eval after training"], ["custom", "Custom: my task file, metrics and gates"]], {name: "eval-mode"});
  const taskFile = dropdown([["", "None"], ...fileOptions(taskFiles)], {name: "eval-task-file"});
  const metricBoxes = EVAL_METRICS.map(([value, text]) => {
    const box = h("input", {type: "checkbox", name: "eval-metric", value, checked: value === "exact_match"});
    box.id = uid("metric");
    return [box, h("label", {for: box.id}, text)];
  });
  const golden = h("input", {type: "checkbox", name: "eval-golden", checked: true, id: uid("golden")});
  const safety = h("input", {type: "checkbox", name: "eval-safety", checked: true, id: uid("safety")});
  const maxNewTokens = h("input", {type: "text", inputmode: "numeric", name: "eval-max-new-tokens", placeholder: "64"});
  const maxExamples = h("input", {type: "text", inputmode: "numeric", name: "eval-max-examples", placeholder: "200"});
  const gateList = h("div", {class: "gates"});
  const addGate = h("button", {type: "button", class: "secondary small"}, "Add a gate");
  addGate.addEventListener("click", () => { gateList.append(gateRow(changed)); changed(); });
  const customEval = h("div", {class: "custom-eval", hidden: true},
    field("Task file", taskFile, "Prompts with reference answers (chat lines: the last assistant turn is the reference)."),
    h("fieldset", {class: "inline"}, h("legend", null, "Task metrics"),
      metricBoxes.map(([box, label]) => h("span", {class: "checkbox"}, box, label))),
    h("div", {class: "field checkbox"}, golden, h("label", {for: golden.id}, "Run the golden (general-ability) set")),
    h("div", {class: "field checkbox"}, safety, h("label", {for: safety.id}, "Run the safety (harmful-prompt) set")),
    h("div", {class: "field-grid"},
      field("Max new tokens", maxNewTokens, "Tokens generated per task or safety prompt (1-2048). Default: 64."),
      field("Max examples", maxExamples, "Task and validation examples evaluated at most. Default: 200.")),
    h("p", {class: "muted"}, "Without gates the platform's default gates apply."),
    gateList, addGate);
  evalMode.addEventListener("change", () => { customEval.hidden = evalMode.value !== "custom"; });

  // job
  const suffix = h("input", {type: "text", name: "suffix", maxlength: 64, autocomplete: "off"});
  const seed = h("input", {type: "text", inputmode: "numeric", name: "seed", placeholder: "random"});
  const validationSplit = h("input", {type: "text", inputmode: "decimal", name: "validation_split", placeholder: "none"});
  const metadata = h("textarea", {name: "metadata", rows: 2, placeholder: "team=nlp\nrun=3"});

  const estimateBox = h("div", {class: "estimate", "aria-live": "polite", "data-testid": "estimate"},
    h("p", {class: "muted"}, "Estimate the job to see its tokens, steps, GPU-hours and price before creating it."));
  const formError = h("p", {class: "form-error", role: "alert", hidden: true, "data-testid": "form-error"});
  const estimateButton = h("button", {type: "button", class: "secondary"}, "Estimate");
  const createButton = h("button", {type: "submit", disabled: true}, "Create job");
  let estimatedBody = null;

  function buildBody() {
    if (!trainingFile.value) throw new Error("training_file: choose or upload a training file");
    if (!model.value) throw new Error("model: choose a base model");
    const hyperparameters = {};
    for (const [spec, input] of [...hpInputs, ...optionInputs]) {
      const value = parseValue(spec, input.value, `method.${method.value}.hyperparameters.${spec.name}`);
      if (value !== undefined) hyperparameters[spec.name] = value;
    }
    const body = {model: model.value, training_file: trainingFile.value,
      method: {type: method.value, [method.value]: {hyperparameters}}};
    if (validationFile.value) body.validation_file = validationFile.value;
    if (suffix.value.trim()) body.suffix = suffix.value.trim();
    const seedValue = parseValue({kind: "int"}, seed.value, "seed");
    if (seedValue !== undefined) body.seed = seedValue;
    const meta = parseMetadata(metadata.value);
    if (meta) body.metadata = meta;
    const split = parseValue({kind: "float"}, validationSplit.value, "data.validation_split");
    if (split !== undefined) body.data = {validation_split: split};
    const adapter = {type: trainingType.value};
    if (trainingType.value !== "full") {
      for (const [spec, input] of adapterInputs) {
        const value = parseValue(spec, input.value, `training_type.${spec.name}`);
        if (value !== undefined) adapter[spec.name] = value;
      }
    }
    body.training_type = adapter;
    if (evalMode.value === "off") body.eval = {enabled: false};
    if (evalMode.value === "custom") {
      const config = {enabled: true, golden: golden.checked, safety: safety.checked,
        metrics: metricBoxes.filter(([box]) => box.checked).map(([box]) => box.value)};
      if (taskFile.value) config.task_file = taskFile.value;
      const tokens = parseValue({kind: "int"}, maxNewTokens.value, "eval.max_new_tokens");
      if (tokens !== undefined) config.max_new_tokens = tokens;
      const examples = parseValue({kind: "int"}, maxExamples.value, "eval.max_examples");
      if (examples !== undefined) config.max_examples = examples;
      const gates = [...gateList.children].map((row, index) => row.read(index));
      if (gates.length) config.gates = gates;
      body.eval = config;
    }
    return body;
  }

  function showFormError(error) {
    // an ApiError carries the API's error.message; the form's own checks name the field
    formError.textContent = error ? error.message || String(error) : "";
    formError.hidden = !error;
  }

  function changed() {
    let body = null;
    try {
      body = JSON.stringify(buildBody());
    } catch {
      body = null;
    }
    const fresh = body !== null && body === estimatedBody;
    createButton.disabled = !fresh;
    estimateBox.classList.toggle("stale", estimatedBody !== null && !fresh);
  }

  function drawEstimate(estimate) {
    const hp = estimate.hyperparameters || {};
    fill(estimateBox,
      h("h3", null, "Estimate"),
      facts([
        ["Training tokens", formatNumber(estimate.training_tokens)],
        ["Examples", `${formatNumber(estimate.train_examples)} training · ${formatNumber(estimate.validation_examples)} validation`],
        ["Steps", formatNumber(estimate.steps)],
        ["GPUs", `${formatNumber(estimate.gpus)} × ${estimate.gpu_type}`],
        ["Runtime", `about ${formatNumber(Math.round(estimate.estimated_runtime_seconds))} s`],
        ["GPU-hours", formatNumber(estimate.estimated_gpu_hours)],
        ["Price", `${formatNumber(estimate.estimated_price)} ${estimate.currency}`],
        ["Queue position", formatNumber(estimate.queue_position)],
      ], {"data-testid": "estimate-figures"}),
      h("details", null, h("summary", null, "Resolved hyperparameters"),
        facts(Object.entries(hp).map(([name, value]) => [name, formatValue(value)]))));
  }

  estimateButton.addEventListener("click", () => busy(estimateButton, async () => {
    showFormError(null);
    let body;
    try {
      body = buildBody();
    } catch (error) {
      showFormError(error);
      return;
    }
    let estimate;
    try {
      estimate = await post("/v1/fine_tuning/jobs/estimate", body);
    } catch (error) {
      showFormError(error);
      return;
    }
    estimatedBody = JSON.stringify(body);
    drawEstimate(estimate);
    changed();
    announce(`Estimate: ${formatNumber(estimate.steps)} steps, ${formatNumber(estimate.estimated_price)} ${estimate.currency}.`, {from: form});
  }));

  const form = h("form", {class: "create-job", novalidate: true, "aria-labelledby": "create-title"},
    section("Data", field("Training file", trainingFile, "A file with purpose fine-tune that passed validation."),
      upload, field("Validation file", validationFile, "Optional; its loss is reported as validation loss."),
      field("Validation split", validationSplit, "Without a validation file: the share of examples held out (up to 0.5).")),
    section("Model and method",
      h("div", {class: "field-grid"},
        field("Base model", model, "A base model, or one of your fine-tuned models to train further."),
        field("Method", method, "What is learned; each method takes its own data shape."),
        field("Training type", trainingType, "Which weights move.")),
      h("details", null, h("summary", null, "Adapter settings"),
        h("div", {class: "field-grid"}, adapterInputs.map(([spec, input]) => field(spec.name, input, spec.help))))),
    section("Hyperparameters",
      h("p", {class: "muted"}, "Leave a field empty for auto: the platform resolves it from the data and the model, and shows the value on the job."),
      h("div", {class: "field-grid"}, hpInputs.map(([spec, input]) => field(spec.name, input, spec.help))),
      optionBox),
    section("Evaluation", field("Eval after training", evalMode), customEval),
    section("Job", h("div", {class: "field-grid"},
      field("Suffix", suffix, "Up to 64 characters, part of the fine-tuned model's name."),
      field("Seed", seed, "0 to 2147483647; empty: random."),
      field("Metadata", metadata, "key=value pairs, one per line (at most 16)."))),
    section("Estimate and create", estimateBox, formError, h("div", {class: "actions"}, estimateButton, createButton)));

  method.addEventListener("change", () => { drawOptions(); changed(); });
  form.addEventListener("input", changed);
  form.addEventListener("change", changed);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (createButton.disabled) return;
    busy(createButton, async () => {
      clearError();
      const body = buildBody();
      if (JSON.stringify(body) !== estimatedBody) {
        showFormError(new Error("The form changed since the estimate: estimate again before creating the job."));
        return;
      }
      let job;
      try {
        job = await post("/v1/fine_tuning/jobs", body);
      } catch (error) {
        showFormError(error);
        return;
      }
      announce(`Created job ${job.id}.`, {carry: true});
      go(href("jobs", job.id).slice(1));
    });
  });

  fill(main, h("h1", {id: "create-title"}, "New fine-tuning job"), form);
}
