"""A finished attempt's files: the adapter in PEFT format, a full fine-tune's
weights with its tokenizer, the model card beside either, and the per-step results CSV."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from tuneforge.domain.metrics import objective_metrics
from tuneforge.domain.spec import BaseModelRef, JobSpec
from tuneforge.storage.store import ObjectStore

RESULTS_COLUMNS = ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]


ADAPTER_METADATA = "tuneforge.json"


def upload_adapter(model: Any, base: BaseModelRef, job_id: str, store: ObjectStore, adapter_prefix: str) -> list[str]:
    """The adapter in PEFT format: `AutoPeftModelForCausalLM.from_pretrained(folder)` loads it
    with its base, which `adapter_config.json` names by what it was registered from (a hub id or
    a path; the trainer's cache path and the platform's alias mean nothing elsewhere). The alias
    and the base's digest are kept in `tuneforge.json` beside it."""
    model.peft_config["default"].base_model_name_or_path = base.source or base.name
    with tempfile.TemporaryDirectory(prefix="tuneforge-adapter-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True, save_embedding_layers=False)
        metadata = {"job_id": job_id, "base_model": base.name, "base_model_sha256": base.sha256,
                    "base_model_source": base.source or None}
        (Path(tmp) / ADAPTER_METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
        store.delete_prefix(adapter_prefix)
        return store.upload_dir(Path(tmp), adapter_prefix)


def upload_full_model(model: Any, tokenizer: Any, store: ObjectStore, prefix: str) -> list[str]:
    """A full fine-tune: weights and tokenizer as `from_pretrained` loads them."""
    with tempfile.TemporaryDirectory(prefix="tuneforge-model-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        store.delete_prefix(prefix)
        return store.upload_dir(Path(tmp), prefix)


def results_csv(history: list[dict[str, Any]]) -> bytes:
    """One line per step: the fixed columns, then the objective's own figures (`Scores.metrics`) in
    the order they first appeared; a step without one of them leaves its cell empty."""
    extra: dict[str, None] = {}  # an ordered set: the columns keep their order from run to run
    for row in history:
        extra.update(dict.fromkeys(name for name in objective_metrics(row) if name not in RESULTS_COLUMNS))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*RESULTS_COLUMNS, *extra], lineterminator="\n")
    writer.writeheader()
    for row in history:
        own = objective_metrics(row)
        writer.writerow({**{key: "" if row.get(key) is None else row[key] for key in RESULTS_COLUMNS},
                         **{name: "" if own.get(name) is None else own[name] for name in extra}})
    return buffer.getvalue().encode()


MODEL_CARD = "README.md"


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "—" if value is None else str(value)


def model_card(spec: JobSpec, *, kind: str, metrics: dict[str, Any], trained_tokens: int,
               eval_results: dict[str, Any] | None) -> str:
    """README.md beside the weights: what they were trained from (the base and the data by their
    digests), how (method, hyperparameters, seed), what came of it (the last step's losses and
    the evaluation, base against fine-tuned) and how to load them. `kind`: adapter or model."""
    base = spec.base_model
    source = base.source or base.name
    adapter = kind == "adapter"
    name = spec.fine_tuned_model or spec.job_id
    lines = ["---", f"base_model: {json.dumps(source)}", f"library_name: {'peft' if adapter else 'transformers'}",
             f"tags: [tuneforge, {spec.method}, {spec.training_type}]", "---", "", f"# {name}", "",
             f"Fine-tuned by tuneforge job `{spec.job_id}` (attempt {spec.attempt}).", "",
             "## Base model", "", "| | |", "|---|---|", f"| name | {base.name} |", f"| source | {source} |",
             f"| sha256 | `{base.sha256}` |", "", "## Data", "", "| file | id | sha256 |", "|---|---|---|",
             f"| training | {spec.training_file.file_id} | `{spec.training_file.sha256 or '—'}` |"]
    if spec.validation_file is not None:
        lines.append(f"| validation | {spec.validation_file.file_id} | `{spec.validation_file.sha256 or '—'}` |")
    lines += ["", "## Training", "", "| setting | value |", "|---|---|", f"| method | {spec.method} |",
              f"| training type | {spec.training_type} |", f"| seed | {spec.seed} |"]
    if adapter:
        targets = spec.lora.target_modules
        lines += [f"| LoRA rank / alpha / dropout | {spec.lora.rank} / {spec.lora.alpha} / {spec.lora.dropout} |",
                  f"| LoRA targets | {targets if isinstance(targets, str) else ', '.join(targets)} |"]
    lines += [f"| {key} | {_figure(value)} |" for key, value in spec.hyperparameters.flat().items()]
    lines += ["", "## Results", "", "| metric | value |", "|---|---|",
              f"| steps | {metrics.get('steps', '—')} |", f"| trained tokens | {trained_tokens} |"]
    lines += [f"| {key} | {_figure(value)} |" for key, value in metrics.items() if key != "steps"]
    if eval_results:
        base_scores, tuned_scores = eval_results.get("base") or {}, eval_results.get("fine_tuned") or {}
        lines += ["", "## Evaluation", "", "| metric | base | fine-tuned |", "|---|---|---|"]
        lines += [f"| {metric} | {_figure(base_scores.get(metric))} | {_figure(tuned_scores.get(metric))} |"
                  for metric in sorted(set(base_scores) | set(tuned_scores))]
    loader = ("from peft import AutoPeftModelForCausalLM\n\n"
              "model = AutoPeftModelForCausalLM.from_pretrained(\"<this folder>\")"
              if adapter else
              "from transformers import AutoModelForCausalLM\n\n"
              "model = AutoModelForCausalLM.from_pretrained(\"<this folder>\")")
    lines += ["", "## Loading", "", "```python", loader, "```", ""]
    return "\n".join(lines)
