// One prompt, two answers side by side: the base model's and a fine-tuned model's.

import {get, post} from "../api.js";
import {h, fill, field, dropdown} from "../dom.js";
import {announce, busy, messageOf} from "../ui.js";

async function answer(model, prompt, maxTokens, temperature) {
  const body = {model, messages: [{role: "user", content: prompt}], max_tokens: maxTokens, temperature};
  const completion = await post("/v1/chat/completions", body);
  const choice = completion.choices[0] || {};
  return {text: (choice.message && choice.message.content) || "", finish: choice.finish_reason, usage: completion.usage};
}

function column(title, testid) {
  const heading = h("h2", null, title);
  const out = h("pre", {class: "answer", "aria-live": "polite", "data-testid": testid});
  const meta = h("p", {class: "muted"});
  return {heading, out, meta, element: h("section", {class: "panel answer-col", "aria-label": title}, heading, out, meta)};
}

export async function playgroundView(main, _params, query) {
  const models = (await get("/v1/models")).data;
  const tuned = models.filter((m) => m.type === "fine-tuned");
  const bases = models.filter((m) => m.type !== "fine-tuned");
  if (!tuned.length) {
    fill(main, h("h1", null, "Playground"), h("p", null, "No fine-tuned model yet: once a job succeeds, compare its model with its base here."));
    return;
  }
  const model = dropdown(tuned.map((m) => [m.id, `${m.id} (${m.stage})`]), {name: "model"});
  if (query.get("model") && tuned.some((m) => m.id === query.get("model"))) model.value = query.get("model");
  const base = dropdown(bases.map((m) => m.id), {name: "base"});
  const syncBase = () => {
    const chosen = tuned.find((m) => m.id === model.value);
    if (chosen && bases.some((m) => m.id === chosen.base_model)) base.value = chosen.base_model;
  };
  syncBase();
  model.addEventListener("change", syncBase);
  const prompt = h("textarea", {name: "prompt", rows: 3, required: true});
  const maxTokens = h("input", {type: "number", name: "max_tokens", min: 1, max: 4096, value: 64});
  const temperature = h("input", {type: "number", name: "temperature", min: 0, max: 2, step: 0.1, value: 0});
  const run = h("button", {type: "submit"}, "Ask both");
  const left = column("Base model", "answer-base");
  const right = column("Fine-tuned model", "answer-tuned");

  const form = h("form", {class: "playground", "aria-label": "Ask both models"},
    h("div", {class: "field-grid"}, field("Fine-tuned model", model), field("Base model", base, "Defaults to the fine-tuned model's base."),
      field("Max tokens", maxTokens), field("Temperature", temperature, "0 answers greedily.")),
    field("Prompt", prompt, "Sent as one user message to both models."), run);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!prompt.value.trim()) {
      prompt.focus();
      return;
    }
    busy(run, async () => {
      left.heading.textContent = `Base model: ${base.value}`;
      right.heading.textContent = `Fine-tuned: ${model.value}`;
      for (const col of [left, right]) { col.out.textContent = "…"; col.meta.textContent = ""; }
      const settle = async (col, name) => {
        try {
          const result = await answer(name, prompt.value, Number(maxTokens.value) || 64, Number(temperature.value) || 0);
          col.out.textContent = result.text;
          col.meta.textContent = `finish: ${result.finish}; ${result.usage ? result.usage.completion_tokens : "?"} tokens`;
        } catch (error) {
          col.out.textContent = "";
          col.meta.replaceChildren(h("span", {class: "form-error"}, messageOf(error)));
        }
      };
      await Promise.all([settle(left, base.value), settle(right, model.value)]);
      announce("Both answers are in.", {from: form});
    });
  });
  fill(main, h("h1", null, "Playground"), form, h("div", {class: "two-col answers"}, left.element, right.element));
}
