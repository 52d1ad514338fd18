"""Run the post-training evals on one loaded model (torch; called by the trainer).

`observe(model, ...)` measures what one model does — loss and token accuracy
on the golden set (teacher-forced), greedy replies to the safety prompts and
to the task prompts — and `score(base, tuned, ...)` turns the two
observations into the result dicts gates are checked against; `samples`
picks the examples shown with the results. The trainer
calls `observe` twice on the same weights: with the adapter switched off
(the base model) and on (the fine-tuned one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tuneforge.data.errors import BadDataError
from tuneforge.data.tokenize import tokenize_example
from tuneforge.domain.tenant_text import bounded, safe_text, valid_unicode
from tuneforge.eval import metrics as task_metrics
from tuneforge.eval import refusal
from tuneforge.train.batches import collate, score_tokens

# teacher-forced examples scored per forward pass
_SCORE_BATCH = 8
SAMPLES_PER_SUITE = 5  # examples of each suite shown with the results
# one shown text (a prompt, a reference, an answer): cut with a marker, never a reason to refuse the results
MAX_SAMPLE_CHARS = 2000


@dataclass(frozen=True)
class TaskExample:
    prompt_messages: list[dict[str, str]] | None  # chat: the conversation before the last assistant turn
    prompt_text: str | None  # prompt/completion: the plain prompt
    reference: str

    @property
    def prompt_for_judge(self) -> str:
        if self.prompt_messages is None:
            return self.prompt_text or ""
        return "\n".join(f"{m['role']}: {m['content']}" for m in self.prompt_messages)


@dataclass
class Observation:
    """What one model did on the eval suites."""

    golden_loss: float | None = None
    golden_token_accuracy: float | None = None
    safety_replies: list[str] = field(default_factory=list)
    task_answers: list[str] = field(default_factory=list)


def task_examples(rows: list[dict[str, Any]], limit: int) -> list[TaskExample]:
    """Chat rows (the last assistant turn is the reference) or prompt/completion rows. Their text is
    the tenant's JSON, which may hold lone surrogates (`"\\ud800"`): those become U+FFFD here, since
    the tokenizer cannot take them (it would fail the attempt as the platform's fault)."""
    examples = []
    for number, row in enumerate(rows[:limit], start=1):
        messages = row.get("messages")
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages) \
                and messages[-1].get("role") == "assistant":
            turns = [{key: valid_unicode(value) if isinstance(value, str) else value for key, value in m.items()}
                     for m in messages[:-1]]
            examples.append(TaskExample(turns, None, valid_unicode(str(messages[-1].get("content") or ""))))
        elif isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            examples.append(TaskExample(None, valid_unicode(row["prompt"]), valid_unicode(row["completion"])))
        else:
            raise BadDataError("invalid_example", "eval task file: expected 'messages' ending with an assistant "
                                                  "turn, or 'prompt' and 'completion'", line_number=number)
    return examples


@torch.no_grad()
def generate(model: Any, tokenizer: Any, device: torch.device, *, messages: list[dict[str, str]] | None = None,
             text: str | None = None, max_new_tokens: int) -> str:
    """The model's greedy reply (special tokens removed, stripped)."""
    if messages is not None and getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    else:
        if messages is not None:  # a base model without a chat template: plain text turns
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        input_ids = tokenizer(text or "", return_tensors="pt")["input_ids"]
    input_ids = input_ids.to(device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                            max_new_tokens=max_new_tokens, do_sample=False,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
    return tokenizer.decode(output[0, input_ids.shape[1]:], skip_special_tokens=True).strip()


@torch.no_grad()
def teacher_forced(model: Any, tokenizer: Any, device: torch.device, rows: list[dict[str, Any]],
                   max_seq_length: int) -> tuple[float, float]:
    """Mean next-token loss and token accuracy over the assistant tokens of chat rows."""
    examples = [tokenize_example(row, tokenizer, max_seq_length=max_seq_length) for row in rows]
    examples = [e for e in examples if e.num_loss_tokens]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    loss_sum, correct, count = 0.0, 0, 0
    for start in range(0, len(examples), _SCORE_BATCH):
        scores = score_tokens(model, collate(examples[start:start + _SCORE_BATCH], pad, device))
        loss_sum, correct, count = loss_sum + float(scores.loss_sum), correct + scores.correct, count + scores.count
    return loss_sum / max(1, count), correct / max(1, count)


def observe(model: Any, tokenizer: Any, device: torch.device, *, golden: list[dict[str, Any]],
            safety: list[dict[str, Any]], tasks: list[TaskExample], max_new_tokens: int,
            max_seq_length: int) -> Observation:
    was_training = model.training
    model.eval()
    try:
        seen = Observation()
        if golden:
            seen.golden_loss, seen.golden_token_accuracy = teacher_forced(model, tokenizer, device, golden,
                                                                          max_seq_length)
        seen.safety_replies = [generate(model, tokenizer, device, messages=row["messages"][:-1],
                                        max_new_tokens=max_new_tokens) for row in safety]
        seen.task_answers = [generate(model, tokenizer, device, messages=t.prompt_messages, text=t.prompt_text,
                                      max_new_tokens=max_new_tokens) for t in tasks]
        return seen
    finally:
        model.train(was_training)


def score(base: Observation, tuned: Observation, *, safety: list[dict[str, Any]], tasks: list[TaskExample],
          metric_specs: list[Any], detector: Any) -> dict[str, dict[str, float]]:
    """{"base": {...}, "fine_tuned": {...}} with golden.*, safety.* and task.* keys."""
    results: dict[str, dict[str, float]] = {"base": {}, "fine_tuned": {}}
    prompts = [row["messages"][-2]["content"] for row in safety]
    references = [t.reference for t in tasks]
    plain = [s for s in metric_specs if s.name != "llm_judge"]
    for side, seen in (("base", base), ("fine_tuned", tuned)):
        out = results[side]
        if seen.golden_loss is not None:
            out["golden.loss"] = seen.golden_loss
            out["golden.token_accuracy"] = seen.golden_token_accuracy
        if safety:
            out["safety.refusal_rate"] = refusal.refusal_rate(detector, list(zip(prompts, seen.safety_replies)))
        if tasks and plain:
            out.update(task_metrics.aggregate(plain, seen.task_answers, references))
    for spec in metric_specs:
        if spec.name == "llm_judge" and tasks:
            wins = [task_metrics.judge_pairwise(spec, t.prompt_for_judge, t.reference, b, f)
                    for t, b, f in zip(tasks, base.task_answers, tuned.task_answers)]
            results["fine_tuned"]["task.llm_judge_win_rate"] = sum(wins) / len(wins)
    return results


def validation_results(loss: float, accuracy: float, *, perplexity: bool,
                       reward: float | None = None) -> dict[str, float]:
    """`reward`: the mean grader reward of the validation samples (reinforcement)."""
    out = {"validation.loss": loss, "validation.token_accuracy": accuracy}
    if perplexity:
        out["validation.perplexity"] = math.exp(min(loss, 50.0))
    if reward is not None:
        out["validation.reward"] = reward
    return out


def shown(text: str) -> str:
    """A model's (or a tenant's) text as the results show it: safe to store and display (NUL,
    controls, lone surrogates escaped: `domain/tenant_text.py`) and at most `MAX_SAMPLE_CHARS`."""
    return bounded(safe_text(text), MAX_SAMPLE_CHARS)


def samples(base: Observation, tuned: Observation, *, safety: list[dict[str, Any]],
            tasks: list[TaskExample]) -> dict[str, list[dict[str, str]]]:
    """The first examples of each suite side by side — prompt, base answer, fine-tuned answer —
    every text through `shown`; a byte-level model can emit any byte, and these are stored and shown."""
    task = [{"prompt": shown(t.prompt_for_judge), "reference": shown(t.reference), "base": shown(b),
             "fine_tuned": shown(f)}
            for t, b, f in list(zip(tasks, base.task_answers, tuned.task_answers))[:SAMPLES_PER_SUITE]]
    harmful = [{"prompt": shown(row["messages"][-2]["content"]), "base": shown(b), "fine_tuned": shown(f)}
               for row, b, f in list(zip(safety, base.safety_replies, tuned.safety_replies))[:SAMPLES_PER_SUITE]]
    return {"task": task, "safety": harmful}
