"""Benchmark tasks in lm-eval's task format, read from the operator's benchmark folder.

A task is a YAML file (the subset of lm-evaluation-harness's task config that real
tasks use) with its data in local JSON files beside it. Nothing is fetched and no
Python runs: `dataset_path` is `json` with `dataset_kwargs.data_files`, or a local
file or folder, always resolved relative to the task file's folder and kept inside
the benchmark folder; `!function` and `process_docs` are refused at load time with
the file and key named. Templates (`doc_to_text`, `doc_to_target`, `doc_to_choice`,
`description`) are Jinja rendered in a sandbox with a bound on their output.

`load_task` turns a file into a `BenchmarkTask`: its requests (the rendered context
with its choices and gold index, or its target and stop strings) ready for the
trainer to score (`train/benchmark_runner.py`); `score` turns per-request outcomes
into points (0–100). Tenants name tasks (`eval.benchmarks`); only the operator's
folder is searched (`task_index`), never a path a tenant wrote.
"""

from __future__ import annotations

import ast
import json
import random
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from jinja2 import TemplateError
from jinja2.sandbox import SandboxedEnvironment

MAX_TASK_FILE_BYTES = 256 * 1024
MAX_DATA_FILE_BYTES = 256 * 1024 * 1024
MAX_ROWS = 200_000
MAX_RENDERED_CHARS = 100_000  # one rendered template (a context with its few-shot examples)
MAX_TASKS_IN_FOLDER = 2_000
MAX_INCLUDE_DEPTH = 4
MAX_FEWSHOT = 25
DEFAULT_FEWSHOT_SEED = 1234  # lm-eval's default fewshot seed
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
DATA_SUFFIXES = (".jsonl", ".json")

OutputType = Literal["multiple_choice", "generate_until"]
MC_METRICS = ("acc", "acc_norm")
GEN_METRICS = ("exact_match",)

# Keys read here; keys that only describe a task (tags, versions) are accepted and ignored.
_READ = frozenset({
    "task", "include", "dataset_path", "dataset_name", "dataset_kwargs", "test_split", "validation_split",
    "training_split", "fewshot_split", "output_type", "doc_to_text", "doc_to_target", "doc_to_choice",
    "target_delimiter", "fewshot_delimiter", "num_fewshot", "fewshot_config", "metric_list", "limit",
    "generation_kwargs", "description", "filter_list", "repeats",
})
_IGNORED = frozenset({"tag", "group", "task_alias", "metadata", "should_decontaminate",
                      "doc_to_decontamination_query", "dataset_name"})
# Keys of lm-eval task configs that need Python, the network or features not offered here.
_REFUSED = {
    "process_docs": "it runs Python over the documents",
    "process_results": "it runs Python over the results",
    "custom_dataset": "it runs Python to load data",
    "use_prompt": "prompt sources are fetched from the network",
    "doc_to_image": "images are not supported",
    "doc_to_audio": "audio is not supported",
    "unsafe_code": "code execution is not supported",
    "class": "it names a Python class",
}
_FILTERS = frozenset({"regex", "take_first", "lowercase", "uppercase", "remove_whitespace"})


class BenchmarkError(ValueError):
    """A task file that cannot be used, with the file and key it is about."""

    def __init__(self, file: str, message: str, key: str | None = None) -> None:
        self.file, self.key = file, key
        super().__init__(f"{file}: {key + ': ' if key else ''}{message}")


@dataclass(frozen=True)
class Request:
    """One document of a task, ready to score."""

    context: str
    choices: tuple[str, ...] = ()
    """multiple_choice: the continuations (target delimiter included), one per choice."""
    gold: int = 0
    """multiple_choice: the index of the right choice."""
    target: str = ""
    """generate_until: the expected answer."""


@dataclass(frozen=True)
class Filter:
    function: str
    pattern: str | None = None
    group_select: int = 0
    fallback: str = "[invalid]"


@dataclass(frozen=True)
class BenchmarkTask:
    name: str
    output_type: OutputType
    metrics: tuple[str, ...]
    requests: tuple[Request, ...]
    until: tuple[str, ...] = ()
    max_gen_toks: int = 256
    ignore_case: bool = False
    ignore_punctuation: bool = False
    filters: tuple[Filter, ...] = field(default_factory=tuple)


# --- the folder -----------------------------------------------------------------------------------------------


def _jailed(root: Path, folder: Path, relative: Any, file: str, key: str) -> Path:
    """`relative` resolved against `folder`, refused unless it stays inside `root`."""
    if not isinstance(relative, str) or not relative.strip():
        raise BenchmarkError(file, "must be a relative path to a local file", key)
    if "://" in relative or relative.startswith(("hf:", "/", "\\", "~")) or re.match(r"^[A-Za-z]:", relative):
        raise BenchmarkError(file, f"{relative!r}: only paths relative to the task file's folder are allowed "
                                   "(no absolute paths, URLs or hub names)", key)
    if ".." in Path(relative).parts:
        raise BenchmarkError(file, f"{relative!r}: '..' is not allowed", key)
    path = (folder / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise BenchmarkError(file, f"{relative!r} leads outside the benchmark folder", key)
    return path


def task_index(root: Path) -> dict[str, Path]:
    """{task name: YAML file} for every task file under `root` (files whose `task` names a task)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    found: dict[str, Path] = {}
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    for path in files[:MAX_TASKS_IN_FOLDER]:
        if not path.resolve().is_relative_to(root.resolve()):
            continue  # a link out of the folder
        try:
            raw = _read_yaml(path, root)
        except BenchmarkError:
            continue  # reported when the task is asked for by name
        name = raw.get("task") if isinstance(raw, Mapping) else None
        if isinstance(name, str) and re.match(NAME_PATTERN, name) and name not in found:
            found[name] = path
    return found


def load_named(root: Path, name: str) -> BenchmarkTask:
    """The task called `name` in the operator's folder (a name, never a path)."""
    if not re.match(NAME_PATTERN, name or ""):
        raise BenchmarkError(str(name), "not a benchmark task name")
    index = task_index(root)
    if name not in index:
        offered = ", ".join(sorted(index)) or "none"
        raise BenchmarkError(name, f"no benchmark task of that name (offered: {offered})")
    return load_task(index[name], root)


# --- YAML -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Function:
    """`!function module.name` in a task file: kept as a marker so the key holding it can be named."""

    value: str


class _TaskLoader(yaml.SafeLoader):
    """SafeLoader plus a constructor that marks lm-eval's `!function` tag (never imports it)."""


_TaskLoader.add_constructor("!function", lambda loader, node: _Function(str(loader.construct_scalar(node))))


def _read_yaml(path: Path, root: Path) -> dict[str, Any]:
    file = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    size = path.stat().st_size
    if size > MAX_TASK_FILE_BYTES:
        raise BenchmarkError(file, f"{size} bytes; a task file holds at most {MAX_TASK_FILE_BYTES}")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskLoader)  # noqa: S506 - SafeLoader-based
    except yaml.YAMLError as exc:
        raise BenchmarkError(file, f"not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise BenchmarkError(file, "a task file is a mapping of keys")
    return raw


MAX_YAML_NODES = 100_000  # YAML aliases can make a small file a huge tree to walk


def _function_key(raw: Any, file: str) -> str | None:
    """The key holding a `!function` tag, if any (a bounded walk)."""
    pending: list[tuple[Any, str]] = [(raw, "")]
    for _visit in range(MAX_YAML_NODES):
        if not pending:
            return None
        node, prefix = pending.pop()
        if isinstance(node, _Function):
            return prefix or "(top level)"
        if isinstance(node, Mapping):
            pending.extend((value, f"{prefix}.{key}" if prefix else str(key)) for key, value in node.items())
        elif isinstance(node, list):
            pending.extend((value, f"{prefix}[{index}]") for index, value in enumerate(node))
    raise BenchmarkError(file, f"more than {MAX_YAML_NODES} values (aliases expanding?)")


def _config(path: Path, root: Path, depth: int = 0) -> dict[str, Any]:
    """The task file with its `include`s merged under it (lm-eval's template files)."""
    file = str(path.relative_to(root.resolve())) if path.is_relative_to(root.resolve()) else path.name
    raw = _read_yaml(path, root.resolve())
    function = _function_key(raw, file)
    if function:
        raise BenchmarkError(file, "!function runs Python from the task file, which is not supported; "
                                   "write it as a Jinja template or a field name", function)
    include = raw.pop("include", None)
    if include is None:
        return raw
    if depth >= MAX_INCLUDE_DEPTH:
        raise BenchmarkError(file, f"includes nest deeper than {MAX_INCLUDE_DEPTH}", "include")
    base = _config(_jailed(root, path.parent, include, file, "include"), root, depth + 1)
    return {**base, **raw}


# --- templates ------------------------------------------------------------------------------------------------

_JINJA = SandboxedEnvironment(autoescape=False, keep_trailing_newline=True)


def _render(template: Any, doc: Mapping[str, Any], file: str, key: str) -> Any:
    """lm-eval's rule: a field name gives the field's value, an int itself, anything else is a template."""
    if isinstance(template, (int, list)) and not isinstance(template, bool):
        return template
    if not isinstance(template, str):
        raise BenchmarkError(file, f"must be a template, a field name or a number, got {type(template).__name__}",
                             key)
    if template in doc:
        return doc[template]
    try:
        text = _JINJA.from_string(template).render(**doc)
    except (TemplateError, TypeError, ValueError, ArithmeticError) as exc:
        raise BenchmarkError(file, f"the template failed: {exc}", key) from None
    if len(text) > MAX_RENDERED_CHARS:
        raise BenchmarkError(file, f"renders {len(text)} characters; at most {MAX_RENDERED_CHARS}", key)
    return text


def _choices(config: Mapping[str, Any], doc: Mapping[str, Any], file: str) -> list[str]:
    template = config.get("doc_to_choice")
    if isinstance(template, list):
        return [str(_render(item, doc, file, "doc_to_choice")) for item in template]
    value = _render(template, doc, file, "doc_to_choice")
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value) if value.lstrip().startswith("[") else None
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            value = None
    if not isinstance(value, list) or not value:
        raise BenchmarkError(file, "must give a non-empty list of choices", "doc_to_choice")
    return [str(choice) for choice in value]


def _gold(config: Mapping[str, Any], doc: Mapping[str, Any], choices: list[str], file: str) -> int:
    value = _render(config.get("doc_to_target"), doc, file, "doc_to_target")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, str):
        if value not in choices:
            raise BenchmarkError(file, f"target {value[:80]!r} is none of the choices", "doc_to_target")
        return choices.index(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(choices):
        raise BenchmarkError(file, f"target {value!r} is not the index of one of {len(choices)} choices",
                             "doc_to_target")
    return value


def _target_text(config: Mapping[str, Any], doc: Mapping[str, Any], file: str, multiple: bool) -> str:
    if multiple:
        choices = _choices(config, doc, file)
        return choices[_gold(config, doc, choices, file)]
    value = _render(config.get("doc_to_target"), doc, file, "doc_to_target")
    if isinstance(value, list):
        value = value[0] if value else ""
    return str(value)


# --- data -----------------------------------------------------------------------------------------------------


def _read_rows(path: Path, file: str, key: str) -> list[dict[str, Any]]:
    if path.suffix not in DATA_SUFFIXES or not path.is_file():
        raise BenchmarkError(file, f"{path.name}: expected a .jsonl or .json file", key)
    size = path.stat().st_size
    if size > MAX_DATA_FILE_BYTES:
        raise BenchmarkError(file, f"{path.name} is {size} bytes; at most {MAX_DATA_FILE_BYTES}", key)
    text = path.read_text(encoding="utf-8-sig")
    rows: Any
    try:
        rows = json.loads(text) if path.suffix == ".json" and text.lstrip().startswith(("[", "{")) else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise BenchmarkError(file, f"{path.name}: not valid JSON ({exc.msg}, line {exc.lineno})", key) from None
    if isinstance(rows, dict) and isinstance(rows.get("data"), list):
        rows = rows["data"]
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise BenchmarkError(file, f"{path.name}: every row must be a JSON object", key)
    if len(rows) > MAX_ROWS:
        raise BenchmarkError(file, f"{path.name} holds {len(rows)} rows; at most {MAX_ROWS}", key)
    return rows


def _split_files(config: Mapping[str, Any], folder: Path, root: Path, file: str) -> dict[str, list[Path]]:
    """{split: files} as the datasets library's json loader would see them, without the library."""
    source = config.get("dataset_path")
    kwargs = config.get("dataset_kwargs") or {}
    if not isinstance(kwargs, Mapping) or set(kwargs) - {"data_files"}:
        raise BenchmarkError(file, "only data_files is supported", "dataset_kwargs")
    if source == "json":
        data_files = kwargs.get("data_files")
        if isinstance(data_files, (str, list)):
            data_files = {"train": data_files}  # the datasets library's name for an unnamed split
        if not isinstance(data_files, Mapping) or not data_files:
            raise BenchmarkError(file, "dataset_path json needs dataset_kwargs.data_files", "dataset_kwargs")
        return {str(split): [_jailed(root, folder, f, file, "dataset_kwargs.data_files")
                             for f in ([files] if isinstance(files, str) else list(files))]
                for split, files in data_files.items()}
    if kwargs:
        raise BenchmarkError(file, "data_files goes with dataset_path: json", "dataset_kwargs")
    path = _jailed(root, folder, source, file, "dataset_path")
    if path.is_file():
        return {"train": [path]}
    if not path.is_dir():
        raise BenchmarkError(file, f"{source!r} is not a local file or folder (the hub is not reachable)",
                             "dataset_path")
    found: dict[str, list[Path]] = {}
    for data in sorted(p for p in path.iterdir() if p.suffix in DATA_SUFFIXES):
        split = re.split(r"[-_.]", data.stem, maxsplit=1)[0]
        found.setdefault(split, []).append(data)
    return found


def _split(config: Mapping[str, Any], files: Mapping[str, list[Path]], key: str, file: str) -> list[dict[str, Any]]:
    name = config.get(key)
    if name not in files:
        raise BenchmarkError(file, f"no split {name!r} in the data (found: {', '.join(sorted(files)) or 'none'})",
                             key)
    return [row for path in files[name] for row in _read_rows(path, file, key)]


# --- the task -------------------------------------------------------------------------------------------------


def _check_keys(config: Mapping[str, Any], file: str) -> None:
    for key in config:
        if key in _REFUSED:
            raise BenchmarkError(file, f"not supported: {_REFUSED[key]}", key)
        if key not in _READ and key not in _IGNORED:
            raise BenchmarkError(file, "not a supported task key", key)
    if config.get("dataset_name") not in (None, "default"):
        raise BenchmarkError(file, "dataset configurations are hub datasets; use local data_files", "dataset_name")
    if config.get("repeats", 1) != 1:
        raise BenchmarkError(file, "only repeats: 1 is supported", "repeats")


def _metrics(config: Mapping[str, Any], output_type: str, file: str) -> tuple[tuple[str, ...], dict[str, bool]]:
    allowed = MC_METRICS if output_type == "multiple_choice" else GEN_METRICS
    raw = config.get("metric_list") or [{"metric": allowed[0]}]
    if not isinstance(raw, list):
        raise BenchmarkError(file, "must be a list of {metric: ...}", "metric_list")
    names, options = [], {"ignore_case": False, "ignore_punctuation": False}
    for index, item in enumerate(raw):
        key = f"metric_list[{index}]"
        if not isinstance(item, Mapping) or item.get("metric") not in allowed:
            got = item.get("metric") if isinstance(item, Mapping) else item
            raise BenchmarkError(file, f"metric {got!r} is not supported for {output_type} "
                                       f"(supported: {', '.join(allowed)})", key)
        for option, value in item.items():
            if option in options and isinstance(value, bool):
                options[option] = value
            elif option not in ("metric", "aggregation", "higher_is_better") or \
                    (option == "aggregation" and value != "mean"):
                raise BenchmarkError(file, f"option {option}: {value!r} is not supported", key)
        names.append(str(item["metric"]))
    return tuple(dict.fromkeys(names)), options


def _filters(config: Mapping[str, Any], file: str) -> tuple[Filter, ...]:
    raw = config.get("filter_list")
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], Mapping):
        raise BenchmarkError(file, "one filter pipeline is supported", "filter_list")
    out = []
    for index, step in enumerate(raw[0].get("filter") or []):
        key = f"filter_list[0].filter[{index}]"
        name = step.get("function") if isinstance(step, Mapping) else None
        if name not in _FILTERS:
            raise BenchmarkError(file, f"filter {name!r} is not supported (supported: {', '.join(sorted(_FILTERS))})",
                                 key)
        pattern = step.get("regex_pattern")
        if name == "regex":
            if not isinstance(pattern, str) or len(pattern) > 200:
                raise BenchmarkError(file, "regex_pattern must be a string of at most 200 characters", key)
            try:
                re.compile(pattern)
            except re.error as exc:
                raise BenchmarkError(file, f"regex_pattern: {exc}", key) from None
        out.append(Filter(name, pattern, int(step.get("group_select", 0)), str(step.get("fallback", "[invalid]"))))
    return tuple(out)


def _fewshot(config: Mapping[str, Any], docs: list[dict[str, Any]], pool: list[dict[str, Any]], same: bool,
             file: str) -> list[str]:
    """Each document's few-shot prefix: `num_fewshot` examples drawn with a seeded generator per
    document (so a document's examples do not depend on the others), never the document itself."""
    shots = config.get("num_fewshot") or 0
    if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= MAX_FEWSHOT:
        raise BenchmarkError(file, f"must be an integer from 0 to {MAX_FEWSHOT}", "num_fewshot")
    sampler = (config.get("fewshot_config") or {}).get("sampler", "default")
    if sampler not in ("default", "first_n"):
        raise BenchmarkError(file, f"sampler {sampler!r} is not supported (default, first_n)", "fewshot_config")
    delimiter = str(config.get("fewshot_delimiter", "\n\n"))
    target_delimiter = str(config.get("target_delimiter", " "))
    multiple = config.get("output_type") == "multiple_choice"
    prefixes = []
    for index in range(len(docs)):
        if not shots:
            prefixes.append("")
            continue
        candidates = [i for i in range(len(pool)) if not (same and i == index)]
        if len(candidates) < shots:
            raise BenchmarkError(file, f"{shots} few-shot examples asked, {len(candidates)} available",
                                 "num_fewshot")
        picked = candidates[:shots] if sampler == "first_n" else \
            random.Random(f"{DEFAULT_FEWSHOT_SEED}:{index}").sample(candidates, shots)
        examples = [str(_render(config.get("doc_to_text"), pool[i], file, "doc_to_text")) + target_delimiter
                    + _target_text(config, pool[i], file, multiple) for i in picked]
        prefixes.append(delimiter.join(examples) + delimiter)
    return prefixes


def _request(config: Mapping[str, Any], doc: Mapping[str, Any], prefix: str, file: str) -> Request:
    context = prefix + str(_render(config.get("doc_to_text"), doc, file, "doc_to_text"))
    if len(context) > MAX_RENDERED_CHARS:
        raise BenchmarkError(file, f"a context of {len(context)} characters; at most {MAX_RENDERED_CHARS}",
                             "num_fewshot")
    delimiter = str(config.get("target_delimiter", " "))
    if config.get("output_type") == "multiple_choice":
        choices = _choices(config, doc, file)
        return Request(context, tuple(delimiter + c for c in choices), _gold(config, doc, choices, file))
    return Request(context, target=_target_text(config, doc, file, False))


def load_task(path: Path, root: Path) -> BenchmarkTask:
    """One task file read, checked and rendered (every error names the file and key)."""
    root, path = Path(root).resolve(), Path(path).resolve()
    file = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    if not path.is_relative_to(root):
        raise BenchmarkError(file, "the task file is outside the benchmark folder")
    config = _config(path, root)
    _check_keys(config, file)
    name = config.get("task")
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise BenchmarkError(file, "must name the task (letters, digits, _ . -)", "task")
    output_type = config.get("output_type", "generate_until")
    if output_type not in ("multiple_choice", "generate_until"):
        raise BenchmarkError(file, f"{output_type!r} is not supported (multiple_choice, generate_until)",
                             "output_type")
    for key in ("doc_to_text", "doc_to_target") + (("doc_to_choice",) if output_type == "multiple_choice" else ()):
        if key not in config:
            raise BenchmarkError(file, f"{output_type} needs {key}", key)
    metrics, options = _metrics(config, output_type, file)
    files = _split_files(config, path.parent, root, file)
    test_key = "test_split" if config.get("test_split") else "validation_split"
    if not config.get(test_key):
        raise BenchmarkError(file, "name the split to evaluate (test_split or validation_split)", "test_split")
    docs = _split(config, files, test_key, file)
    limit = config.get("limit")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0:
            raise BenchmarkError(file, "must be a positive number (a count, or a fraction below 1)", "limit")
        docs = docs[: int(limit) if limit >= 1 else max(1, int(len(docs) * limit))]
    fewshot_key = next((k for k in ("fewshot_split", "training_split", "validation_split") if config.get(k)), None)
    pool = _split(config, files, fewshot_key, file) if (config.get("num_fewshot") and fewshot_key) else docs
    same = not config.get("num_fewshot") or fewshot_key is None or config.get(fewshot_key) == config.get(test_key)
    prefixes = _fewshot(config, docs, pool, same, file)
    description = str(_render(config["description"], {}, file, "description")) if config.get("description") else ""
    requests = tuple(_request(config, doc, description + prefix, file) for doc, prefix in zip(docs, prefixes))
    generation = config.get("generation_kwargs") or {}
    if not isinstance(generation, Mapping) or set(generation) - {"until", "max_gen_toks", "do_sample",
                                                                 "temperature"}:
        raise BenchmarkError(file, "supported: until, max_gen_toks (decoding is greedy)", "generation_kwargs")
    if generation.get("do_sample") or generation.get("temperature", 0) not in (0, 0.0):
        raise BenchmarkError(file, "decoding is greedy (do_sample: false, temperature: 0)", "generation_kwargs")
    until = generation.get("until", [str(config.get("fewshot_delimiter", "\n\n"))])
    until = [until] if isinstance(until, str) else until
    max_gen = generation.get("max_gen_toks", 256)
    if not isinstance(max_gen, int) or not 1 <= max_gen <= 2048:
        raise BenchmarkError(file, "max_gen_toks must be an integer from 1 to 2048", "generation_kwargs")
    return BenchmarkTask(name, output_type, metrics, requests, tuple(str(u) for u in until if u), max_gen,
                         options["ignore_case"], options["ignore_punctuation"], _filters(config, file))


# --- scoring --------------------------------------------------------------------------------------------------


def choice_scores(task: BenchmarkTask, loglikelihoods: list[list[float]]) -> dict[str, float]:
    """{metric: points} from each request's log-likelihood per choice: acc takes the likeliest
    choice, acc_norm the likeliest per UTF-8 byte of the choice (lm-eval's length normalisation)."""
    hits = {"acc": 0, "acc_norm": 0}
    for request, scores in zip(task.requests, loglikelihoods):
        best = max(range(len(scores)), key=lambda i: scores[i])
        normed = [s / max(1, len(c.encode("utf-8"))) for s, c in zip(scores, request.choices)]
        best_norm = max(range(len(normed)), key=lambda i: normed[i])
        hits["acc"] += best == request.gold
        hits["acc_norm"] += best_norm == request.gold
    total = max(1, len(task.requests))
    return {metric: 100.0 * hits[metric] / total for metric in task.metrics}


def cut_at_stops(text: str, until: tuple[str, ...]) -> str:
    """The generation up to the first stop string (lm-eval's `until`)."""
    for stop in until:
        if stop and stop in text:
            text = text.split(stop, 1)[0]
    return text


def _apply_filters(text: str, filters: tuple[Filter, ...]) -> str:
    for step in filters:
        if step.function == "regex" and step.pattern is not None:
            found = re.findall(step.pattern, text[:MAX_RENDERED_CHARS])
            if not found:
                text = step.fallback
                continue
            match = found[step.group_select] if -len(found) <= step.group_select < len(found) else found[0]
            text = next((m for m in match if m), "") if isinstance(match, tuple) else match
        elif step.function == "lowercase":
            text = text.lower()
        elif step.function == "uppercase":
            text = text.upper()
        elif step.function == "remove_whitespace":
            text = text.lstrip()
    return text


def _normal(text: str, task: BenchmarkTask) -> str:
    if task.ignore_case:
        text = text.lower()
    if task.ignore_punctuation:
        text = text.translate(str.maketrans("", "", string.punctuation))
    return text


def generation_scores(task: BenchmarkTask, generations: list[str]) -> dict[str, float]:
    """{"exact_match": points}: each generation cut at the stop strings, filtered, compared whole."""
    hits = sum(_normal(_apply_filters(cut_at_stops(text, task.until), task.filters), task) ==
               _normal(request.target, task) for request, text in zip(task.requests, generations))
    return {"exact_match": 100.0 * hits / max(1, len(task.requests))}


def result_keys(task: BenchmarkTask, points: Mapping[str, float]) -> dict[str, float]:
    """The eval result keys of a task: `benchmark:<task>` (its first metric) and `benchmark:<task>.<metric>`."""
    out = {f"benchmark:{task.name}": points[task.metrics[0]]}
    out.update({f"benchmark:{task.name}.{metric}": value for metric, value in points.items()})
    return out
