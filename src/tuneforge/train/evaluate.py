"""The trainer's evaluate phase: after the artifacts are written, the base and
the fine-tuned model are measured on the same data (validation set, the
tenant's task file, the platform's golden and safety sets).

With an adapter (LoRA, QLoRA) both are the same loaded weights, the adapter
switched off for the base; a full fine-tune loads the base model beside it
for the duration. The control plane checks gates against the results
(`eval/gates.py`); the trainer only measures.

A failing eval input (a bad line in the task file, an unreachable judge) does
not throw the training away: the error is recorded with the results, and the
gates that needed the missing metric fail with that reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tuneforge import methods
from tuneforge.data.errors import BadDataError
from tuneforge.domain.errors import ApiError
from tuneforge.domain.resolved import ResolvedEval
from tuneforge.eval import benchmarks as benchmark_tasks
from tuneforge.eval import metrics as task_metrics
from tuneforge.eval import refusal, shipped
from tuneforge.eval.openai_chat import ChatEndpoint, ChatEndpointError
from tuneforge.train import benchmark_runner, credentials
from tuneforge.train import eval_runner as runner
from tuneforge.train.errors import UserInputError
from tuneforge.train.model import is_adapter, load_spec_base
from tuneforge.train.reporter import message_event

log = logging.getLogger(__name__)


def eval_config(spec: Any) -> ResolvedEval | None:
    """The attempt's eval, or None when the job has none."""
    config = spec.eval
    return config if config is not None and config.enabled else None


def evaluate(run: Any, validate: Callable[[Any], tuple[Any, ...]]) -> dict[str, Any] | None:
    """Measure base and fine-tuned model; None when the job has no eval. `validate(run)` is the
    recipe's validation pass (its objective's loss and token accuracy on the validation set)."""
    config = eval_config(run.spec)
    if config is None:
        return None
    started = time.monotonic()
    run.reporter.report("evaluating", {"step": run.state.step})
    errors: list[dict[str, Any]] = []
    golden = shipped.golden_examples() if config.golden else []
    safety = shipped.safety_examples() if config.safety else []
    tasks, specs = _tasks(run, config, errors)
    suites_of_benchmarks = _benchmarks(run, config, errors)
    try:
        detector = refusal.detector_from_config(task_metrics.plain(config.safety_detector))
    except ApiError as exc:  # the job's eval names a detector this trainer cannot build
        raise UserInputError("invalid_eval_config", exc.message, param=exc.param or "eval") from None
    specs, detector = _with_credentials(run, specs, detector, errors)
    limit = config.max_examples
    suites = dict(golden=golden, safety=safety, tasks=tasks, max_new_tokens=config.max_new_tokens,
                  max_seq_length=run.spec.hyperparameters.max_seq_length)
    valid_rows = run.valid_set[:limit]
    tuned = runner.observe(run.model, run.tokenizer, run.device, **suites)
    tuned_valid = _validation(run, validate, valid_rows)
    tuned_valid.update(_score_benchmarks(run, run.model, suites_of_benchmarks, config))
    with _base_model(run) as base_model:
        base = runner.observe(base_model, run.tokenizer, run.device, **suites)
        base_valid = _validation(run, validate, valid_rows, model=base_model)
        base_valid.update(_score_benchmarks(run, base_model, suites_of_benchmarks, config))
    try:
        results = runner.score(base, tuned, safety=safety, tasks=tasks, metric_specs=specs, detector=detector)
    except task_metrics.JudgeError as exc:
        errors.append({"suite": "task", "metric": "llm_judge", "message": str(exc)})
        results = runner.score(base, tuned, safety=safety, tasks=tasks, detector=detector,
                               metric_specs=[s for s in specs if s.name != "llm_judge"])
    except task_metrics.MetricFailed as exc:  # the tenant's metric: a user error, billed and not retried
        raise UserInputError(exc.code, str(exc), param=exc.param) from None
    except refusal.GuardModelError as exc:  # the guard model is unreachable: no safety figures
        errors.append({"suite": "safety", "metric": "refusal_rate", "message": str(exc)})
        results = runner.score(base, tuned, safety=[], tasks=tasks, metric_specs=specs, detector=detector)
    results["base"].update(base_valid)
    results["fine_tuned"].update(tuned_valid)
    samples = runner.samples(base, tuned, safety=safety, tasks=tasks)  # made safe and bounded there
    counts = {"validation": len(valid_rows), "task": len(tasks), "golden": len(golden), "safety": len(safety),
              "benchmark": sum(len(task.requests) for task in suites_of_benchmarks)}
    duration = time.monotonic() - started
    run.reporter.report("events", message_event(
        f"evaluated base and fine-tuned model in {duration:.1f} s "
        f"({', '.join(f'{n} {k}' for k, n in counts.items() if n)} examples)",
        data={"eval": {k: results[k] for k in ("base", "fine_tuned")}}))
    return {**results, "examples": counts, "samples": samples, "errors": errors, "duration_s": round(duration, 3)}



def _with_credentials(run: Any, specs: list, detector: Any, errors: list[dict[str, Any]]) -> tuple[list, Any]:
    """The judge and guard endpoints bound to the URLs and keys they name (fetched from the
    control plane only when a config names a secret or an operator endpoint). One that cannot be
    bound stays unbound: asking it fails, and that is recorded with the results."""
    guard = isinstance(detector, refusal.GuardModelDetector)
    targets = [s.target for s in specs if isinstance(s, task_metrics.LlmJudge)] + ([detector.target] if guard else [])
    if not any(target.needs_credentials for target in targets):
        return specs, detector
    try:
        found = credentials.fetch(run.spec)
    except ChatEndpointError as exc:
        log.warning("eval endpoints stay unbound: %s", exc)
        errors.append({"suite": "eval", "message": str(exc)})
        return specs, detector

    def bound(target: ChatEndpoint) -> ChatEndpoint:
        try:
            return target.bind(found)
        except ChatEndpointError as exc:
            errors.append({"suite": "eval", "message": str(exc)})
            return target

    specs = [dataclasses.replace(s, target=bound(s.target)) if isinstance(s, task_metrics.LlmJudge) else s
             for s in specs]
    if guard:
        detector = dataclasses.replace(detector, target=bound(detector.target))
    return specs, detector


def _tasks(run: Any, config: ResolvedEval, errors: list[dict[str, Any]]) -> tuple[list[runner.TaskExample], list]:
    key = config.task_file_key
    if not key:
        return [], []
    try:
        specs = task_metrics.parse_metrics(task_metrics.plain(config.metrics))
        rows = _read_jsonl(run.store.get_bytes(key))
        return runner.task_examples(rows, config.max_examples), specs
    except (BadDataError, ApiError, OSError) as exc:
        errors.append({"suite": "task", "message": str(exc)})
        run.reporter.report("events", message_event(f"task eval skipped: {exc}", level="warn"))
        return [], []


def _benchmarks(run: Any, config: ResolvedEval, errors: list[dict[str, Any]]) -> list[benchmark_tasks.BenchmarkTask]:
    """The job's benchmark tasks read from the operator's folder; one that cannot be read is recorded
    (its gate then fails as not measured) and the others run."""
    if not config.benchmarks or not config.benchmark_dir:
        return []
    loaded = []
    for name in config.benchmarks:
        try:
            loaded.append(benchmark_tasks.load_named(Path(config.benchmark_dir), name))
        except (benchmark_tasks.BenchmarkError, OSError) as exc:
            errors.append({"suite": "benchmark", "task": name, "message": str(exc)})
            run.reporter.report("events", message_event(f"benchmark {name} skipped: {exc}", level="warn"))
    return loaded


def _score_benchmarks(run: Any, model: Any, tasks: list[benchmark_tasks.BenchmarkTask],
                      config: ResolvedEval) -> dict[str, float]:
    out: dict[str, float] = {}
    for task in tasks:
        out.update(benchmark_runner.run_task(model, run.tokenizer, run.device, task,
                                             batch_size=config.benchmark_batch_size))
    return out


def _read_jsonl(data: bytes) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(data.decode("utf-8-sig").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadDataError("invalid_json", f"eval task file: {exc.msg}", line_number=number) from None
        if not isinstance(row, dict):
            raise BadDataError("invalid_example", "eval task file: a line must be a JSON object", line_number=number)
        rows.append(row)
    return rows


def _validation(run: Any, validate: Callable[[Any], tuple[Any, ...]], rows: list[Any],
                model: Any = None) -> dict[str, float]:
    if not rows:
        return {}
    saved_model, saved_rows = run.model, run.valid_set
    run.model, run.valid_set = (model if model is not None else run.model), rows
    try:
        loss, accuracy, *rest = validate(run)
    finally:
        run.model, run.valid_set = saved_model, saved_rows
    figures = rest[0] if rest else {}
    return runner.validation_results(loss, accuracy, perplexity=methods.get(run.spec.method).default_eval.perplexity,
                                     reward=figures.get("valid_reward_mean"))


@contextlib.contextmanager
def _base_model(run: Any) -> Iterator[Any]:
    """The base model: the adapter switched off, or (a full fine-tune) the base loaded beside it."""
    if is_adapter(run.model):
        with run.model.disable_adapter():
            yield run.model
        return
    base, _tokenizer = load_spec_base(run.store, run.spec, run.device)
    try:
        yield base
    finally:
        del base
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
