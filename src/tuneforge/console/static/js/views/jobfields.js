// The create-job form's settings: each field with its documented default and help (the
// API's own field descriptions), and how a field's text becomes a value of the body.

export const METHODS = [
  ["supervised", "supervised — chat or prompt/completion examples"],
  ["dpo", "dpo — preference pairs, reference = the base model"],
  ["orpo", "orpo — preference pairs, no reference"],
  ["kto", "kto — completions labelled good or bad"],
  ["simpo", "simpo — preference pairs, length-normalised"],
  ["cpt", "cpt — continued pre-training on plain text"],
];

export const TRAINING_TYPES = [
  ["lora", "lora — a LoRA adapter on a frozen base (default)"],
  ["qlora", "qlora — LoRA on a 4-bit base (needs an NVIDIA GPU)"],
  ["full", "full — every weight trains"],
];

/** Shared hyperparameters: name, kind (int, float, choice, bool), help, choices. */
export const HYPERPARAMETERS = [
  {name: "n_epochs", kind: "int", help: "Passes over the training data (1-50). auto: 3; more for tiny datasets (at least 100 examples seen, at most 25 epochs), fewer for large ones."},
  {name: "batch_size", kind: "int", help: "Examples per optimizer step (1-256). auto: about 0.2% of the examples, a power of two from 1 to 32."},
  {name: "learning_rate_multiplier", kind: "float", help: "Scales the method's default learning rate (supervised LoRA 2e-4, full 2e-5; see the methods). auto: 1."},
  {name: "learning_rate", kind: "float", help: "Absolute learning rate; overrides the multiplier."},
  {name: "warmup_ratio", kind: "float", help: "Fraction of steps of linear warmup (0-0.5). auto: 0.03."},
  {name: "lr_scheduler_type", kind: "choice", choices: ["linear", "cosine", "constant"], help: "Learning-rate decay after warmup. auto: linear."},
  {name: "weight_decay", kind: "float", help: "AdamW weight decay. auto: 0."},
  {name: "max_grad_norm", kind: "float", help: "Gradient clipping norm (0 disables). auto: 1."},
  {name: "max_seq_length", kind: "int", help: "Tokens per example; longer examples are truncated from the end. auto: the model's limit, at most 2048."},
  {name: "train_on_inputs", kind: "bool", help: "Also compute the loss on system/user/prompt tokens. auto: no."},
  {name: "gradient_accumulation_steps", kind: "int", help: "Micro-batches per optimizer step; micro-batch = batch_size / this. auto: from the memory model."},
  {name: "packing", kind: "bool", help: "Pack a step's examples into max_seq_length rows (attention never crosses examples). auto: on."},
];

/** A method's own options, shown only for that method. */
export const METHOD_OPTIONS = {
  dpo: [{name: "beta", kind: "float", help: "Strength of the pull towards the reference (base) model: larger keeps the fine-tune closer to it. auto: 0.1."}],
  orpo: [{name: "beta", kind: "float", help: "Weight of the odds-ratio term against the supervised loss of the chosen answer. auto: 0.1."}],
  kto: [
    {name: "beta", kind: "float", help: "Sharpness of the value function around the reference point; larger keeps the fine-tune closer to the base model. auto: 0.1."},
    {name: "desirable_weight", kind: "float", help: "Weight of the desirable completions' loss (lambda_D). auto: 1."},
    {name: "undesirable_weight", kind: "float", help: "Weight of the undesirable completions' loss (lambda_U). auto: 1."},
  ],
  simpo: [
    {name: "beta", kind: "float", help: "Scale of the length-normalised reward. auto: 2."},
    {name: "gamma", kind: "float", help: "Target reward margin between chosen and rejected. auto: 0.5."},
  ],
};

export const ADAPTER_FIELDS = [
  {name: "rank", kind: "int", help: "LoRA rank r. auto: 8 below 1B parameters, 16 up to 15B, 32 up to 40B, 64 above."},
  {name: "alpha", kind: "float", help: "LoRA alpha. auto: 2 × rank."},
  {name: "dropout", kind: "float", help: "LoRA dropout, from 0 up to (not including) 1. Default: 0."},
];

export const EVAL_METRICS = [
  ["exact_match", "exact match"], ["contains", "contains"], ["rouge_l", "ROUGE-L"], ["json_valid", "valid JSON"],
];

export const GATE_OPS = ["<", "<=", ">", ">=", "=="];

/** A field's text as the body's value: undefined when left as auto; throws naming the field. */
export function parseValue(spec, text, path) {
  const raw = String(text).trim();
  if (raw === "" || raw === "auto") return undefined;
  if (spec.kind === "choice") return raw;
  if (spec.kind === "bool") return raw === "true";
  const value = Number(raw);
  if (!Number.isFinite(value)) throw new Error(`${path} must be a number or empty (auto); got "${raw}"`);
  if (spec.kind === "int" && !Number.isInteger(value)) throw new Error(`${path} must be a whole number; got "${raw}"`);
  return value;
}

/** "team=nlp\nrun=3" → {team: "nlp", run: "3"}; throws on a line that is not key=value. */
export function parseMetadata(text) {
  const metadata = {};
  for (const line of text.split(/[\n,]/).map((part) => part.trim()).filter(Boolean)) {
    const cut = line.indexOf("=");
    if (cut <= 0) throw new Error(`metadata: "${line}" is not key=value`);
    metadata[line.slice(0, cut).trim()] = line.slice(cut + 1).trim();
  }
  return Object.keys(metadata).length ? metadata : undefined;
}
