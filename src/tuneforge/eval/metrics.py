"""Task metrics: how well a model's generated answer matches the reference answer.

A job's create body names its metrics in `eval.metrics`, each a string or an
object with options:

    ["exact_match", {"type": "regex", "pattern": "^\\d+$"},
     {"type": "llm_judge", "endpoint": "https://judge.example.com/v1", "model": "judge",
      "api_key_secret": "JUDGE_KEY"}]

`parse_metrics` turns that list into frozen specs (or raises the API error
naming the bad field), `score` grades one answer, `aggregate` averages every
metric over a set of answers into result keys such as `task.exact_match`.

A tenant's metric runs on the trainer, so it is bounded: a `regex` is RE2 (linear
time in the answer, no backreferences or lookaround; `re` could backtrack for
hours while holding the GIL, which starves the trainer's heartbeat thread so the
attempt looks like a lost node), and `aggregate` scores each metric under a
deadline (`METRIC_DEADLINE_S` over all the answers). A metric that fails or runs
past its deadline raises `MetricFailed`: the tenant's configuration, so the
trainer ends the attempt as a user error (billed, not retried).

`llm_judge` is different: it does not grade one answer against the reference
but compares the base model's answer with the fine-tuned model's
(`judge_pairwise`), asking the judge twice with the answers' positions swapped
so that a judge's preference for the first (or second) position cancels out.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
import re2

from tuneforge.domain.errors import invalid
from tuneforge.eval.openai_chat import ChatEndpoint, ChatEndpointError, complete, open_client, parse_endpoint

log = logging.getLogger(__name__)

DEFAULT_METRICS = ("exact_match", "rouge_l")
JUDGE_WIN_RATE_KEY = "task.llm_judge_win_rate"
MAX_PATTERN_CHARS = 1000  # a regex metric's pattern; answers are short, so are useful patterns
# RE2's memory for one compiled pattern: a pattern whose automaton needs more is refused at create
REGEX_MAX_MEM_BYTES = 8 * 1024 * 1024
# one metric over every answer of one model: far above what the built-in metrics need for
# max_examples answers, far below the lease timeout a hang would otherwise run into
METRIC_DEADLINE_S = 60.0
ROUGE_MAX_WORDS = 2048  # words of each text ROUGE-L compares (an answer is max_new_tokens long)


class MetricFailed(Exception):
    """A tenant's metric could not score the answers (it errored, or ran past its deadline).
    The tenant's configuration is at fault: the trainer fails the attempt as a user error with
    `code` and the message, which names the metric and holds nothing of the host."""

    def __init__(self, code: str, message: str, *, param: str = "eval.metrics") -> None:
        super().__init__(message)
        self.code = code
        self.param = param


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEM_BYTES
    options.log_errors = False  # a tenant's bad pattern is a 400, not a line in the server's log
    return options


@functools.lru_cache(maxsize=64)  # a job's few patterns, compiled once for all its answers
def compile_pattern(pattern: str) -> Any:
    """A regex metric's pattern compiled by RE2; raises `re2.error` for one RE2 cannot run."""
    return re2.compile(pattern, _re2_options())


@dataclass(frozen=True)
class ExactMatch:
    """The answer equals the reference once leading and trailing whitespace is trimmed."""

    name: ClassVar[str] = "exact_match"
    case_sensitive: bool = False
    """Compare letters case-sensitively; by default "Paris" matches "paris"."""


@dataclass(frozen=True)
class Contains:
    """The trimmed reference appears somewhere in the answer."""

    name: ClassVar[str] = "contains"
    case_sensitive: bool = False
    """Compare letters case-sensitively."""


@dataclass(frozen=True)
class Regex:
    """The answer matches a regular expression (searched anywhere in it); the reference is not used."""

    name: ClassVar[str] = "regex"
    pattern: str
    """An RE2 regular expression (Python syntax without backreferences or lookaround), e.g.
    "^\\d+$" for an answer that is a number."""


@dataclass(frozen=True)
class JsonValid:
    """The trimmed answer parses as JSON; the reference is not used."""

    name: ClassVar[str] = "json_valid"
    require_object: bool = False
    """Only a JSON object ({...}) counts, not an array, string or number."""


@dataclass(frozen=True)
class RougeL:
    """ROUGE-L F1: longest common subsequence of lowercase word tokens of answer and reference."""

    name: ClassVar[str] = "rouge_l"


@dataclass(frozen=True)
class LlmJudge:
    """A judge model compares the base and the fine-tuned answer (result key task.llm_judge_win_rate)."""

    name: ClassVar[str] = "llm_judge"
    target: ChatEndpoint
    """Where the judge is served: the tenant's URL (`endpoint`, `model`, `api_key_secret`) or an
    endpoint the operator offers (`endpoint_name`); eval/openai_chat.py."""
    criteria: str | None = None
    """What makes an answer better; default: correct against the reference, then helpful and concise."""

    @property
    def model(self) -> str | None:
        return self.target.model


MetricSpec = ExactMatch | Contains | Regex | JsonValid | RougeL | LlmJudge


class JudgeError(Exception):
    """The LLM judge could not be asked (unreachable, timed out, an HTTP error, an unreadable answer)."""


# --- parsing -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Option:
    kind: type  # bool, str or float
    required: bool = False


_OPTIONS: dict[str, dict[str, _Option]] = {
    "exact_match": {"case_sensitive": _Option(bool)},
    "contains": {"case_sensitive": _Option(bool)},
    "regex": {"pattern": _Option(str, required=True)},
    "json_valid": {"require_object": _Option(bool)},
    "rouge_l": {},
    "llm_judge": {"endpoint": _Option(str), "endpoint_name": _Option(str), "model": _Option(str),
                  "api_key_secret": _Option(str), "criteria": _Option(str), "timeout_s": _Option(float)},
}
_KIND_WORDS = {bool: "true or false", str: "a non-empty string", float: "a positive number"}


def _is_kind(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is str:
        return isinstance(value, str) and bool(value.strip())
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def _options(index: int, name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The options of metric `index`, type-checked; unknown and missing ones are errors naming the field."""
    known = _OPTIONS[name]
    if name == "llm_judge" and "api_key_env" in given:
        parse_endpoint(given, f"eval.metrics[{index}]", name)  # says what replaced it
    for key in given:
        if key not in known:
            allowed = ", ".join(known) or "none"
            raise invalid(f"eval.metrics[{index}].{key}: {name} has no option {key!r} (options: {allowed})",
                          param=f"eval.metrics[{index}].{key}")
    for key, option in known.items():
        param = f"eval.metrics[{index}].{key}"
        if key not in given or given[key] is None:
            if option.required:
                raise invalid(f"{param}: {name} needs {key!r}: give {{\"type\": \"{name}\", \"{key}\": ...}}",
                              param=param)
            continue
        if not _is_kind(given[key], option.kind):
            raise invalid(f"{param} must be {_KIND_WORDS[option.kind]}, got {given[key]!r}", param=param)
    return {key: value for key, value in given.items() if value is not None}


def _checked_spec(index: int, name: str, options: dict[str, Any]) -> MetricSpec:
    if name == "regex":
        param = f"eval.metrics[{index}].pattern"
        if len(options["pattern"]) > MAX_PATTERN_CHARS:
            raise invalid(f"{param} is longer than {MAX_PATTERN_CHARS} characters", param=param)
        try:
            compile_pattern(options["pattern"])
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise invalid(f"{param} is not a regular expression RE2 can run (linear-time matching: no "
                          f"backreferences or lookaround, bounded size): {str(reason)[:200]}",
                          param=param) from None
    if name == "llm_judge":
        criteria = options.get("criteria")
        if criteria is not None and len(criteria) > 4000:
            raise invalid(f"eval.metrics[{index}].criteria is longer than 4000 characters",
                          param=f"eval.metrics[{index}].criteria")
        return LlmJudge(parse_endpoint(options, f"eval.metrics[{index}]", "llm_judge"), criteria)
    return _SPEC_TYPES[name](**options)


_SPEC_TYPES: dict[str, Callable[..., MetricSpec]] = {
    "exact_match": ExactMatch, "contains": Contains, "regex": Regex,
    "json_valid": JsonValid, "rouge_l": RougeL, "llm_judge": LlmJudge,
}


def plain(value: Any) -> Any:
    """A metric or detector object of a resolved config (mappings, tuples) as the parsers take it:
    dicts and lists."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def parse_metrics(raw: list | None) -> list[MetricSpec]:
    """The specs of `eval.metrics` (default exact_match and rouge_l); a bad item raises the API error naming it."""
    if raw is None:
        raw = list(DEFAULT_METRICS)
    if isinstance(raw, list) and len(raw) > 32:
        raise invalid("eval.metrics may name at most 32 metrics", param="eval.metrics")
    if not isinstance(raw, list):
        raise invalid("eval.metrics must be a list of metric names or objects", param="eval.metrics")
    known = ", ".join(_OPTIONS)
    specs: list[MetricSpec] = []
    for index, item in enumerate(raw):
        if isinstance(item, str):
            name, given, param = item, {}, f"eval.metrics[{index}]"
        elif isinstance(item, dict):
            name, param = item.get("type"), f"eval.metrics[{index}].type"
            given = {k: v for k, v in item.items() if k != "type"}
        else:
            raise invalid(f"eval.metrics[{index}] must be a metric name or an object with a \"type\", "
                          f"got {item!r}", param=f"eval.metrics[{index}]")
        if not isinstance(name, str) or name not in _OPTIONS:
            raise invalid(f"{param}: unknown metric {name!r} (known: {known})", param=param)
        specs.append(_checked_spec(index, name, _options(index, name, given)))
    return specs


# --- scoring -------------------------------------------------------------------------------------------------


def _fold(text: str, case_sensitive: bool) -> str:
    text = text.strip()
    return text if case_sensitive else text.casefold()


def words(text: str) -> list[str]:
    """Lowercase word tokens (letters, digits, underscore) as ROUGE-L compares them."""
    return re.findall(r"\w+", text.lower())


def lcs_length(first: Sequence[str], second: Sequence[str]) -> int:
    """Length of the longest common subsequence (dynamic programming over two rows)."""
    previous = [0] * (len(second) + 1)
    for item in first:
        current = [0]
        for column, other in enumerate(second, start=1):
            current.append(previous[column - 1] + 1 if item == other else max(previous[column], current[-1]))
        previous = current
    return previous[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 over word tokens; two empty texts agree (1.0), one empty text scores 0.0. Each
    side counts its first `ROUGE_MAX_WORDS` words: the work is their product, so a huge reference
    in a task file cannot make one example take minutes."""
    predicted, wanted = words(prediction)[:ROUGE_MAX_WORDS], words(reference)[:ROUGE_MAX_WORDS]
    if not predicted and not wanted:
        return 1.0
    common = lcs_length(predicted, wanted)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def _json_valid(prediction: str, require_object: bool) -> float:
    try:
        value = json.loads(prediction.strip())
    except ValueError:
        return 0.0
    return 1.0 if isinstance(value, dict) or not require_object else 0.0


def score(spec: MetricSpec, prediction: str, reference: str) -> float:
    """One answer's score in [0, 1] (llm_judge is pairwise: see `judge_pairwise`)."""
    if isinstance(spec, ExactMatch):
        return float(_fold(prediction, spec.case_sensitive) == _fold(reference, spec.case_sensitive))
    if isinstance(spec, Contains):
        return float(_fold(reference, spec.case_sensitive) in _fold(prediction, spec.case_sensitive))
    if isinstance(spec, Regex):
        return float(compile_pattern(spec.pattern).search(prediction) is not None)
    if isinstance(spec, JsonValid):
        return _json_valid(prediction, spec.require_object)
    if isinstance(spec, RougeL):
        return rouge_l(prediction, reference)
    raise TypeError(f"{spec.name} compares two answers: score it with judge_pairwise")


def metric_keys(specs: Sequence[MetricSpec]) -> list[str]:
    """The result key of each spec: task.<name>; a second, different spec of the same name gets
    task.<name>_2 (two regex metrics with different patterns), an identical one shares the key."""
    keys: dict[MetricSpec, str] = {}
    used: dict[str, int] = {}
    for spec in specs:
        if spec in keys:
            continue
        base = "llm_judge_win_rate" if isinstance(spec, LlmJudge) else spec.name
        used[base] = used.get(base, 0) + 1
        keys[spec] = f"task.{base}" if used[base] == 1 else f"task.{base}_{used[base]}"
    return [keys[spec] for spec in specs]


def aggregate(specs: Sequence[MetricSpec], predictions: Sequence[str],
              references: Sequence[str], *, deadline_s: float | None = None) -> dict[str, float]:
    """Mean score of each metric over the examples, e.g. {"task.exact_match": 0.75, "task.rouge_l": 0.61}.
    llm_judge specs are left out (their win rate comes from `judge_pairwise`); no examples give {}.
    A metric that errors or takes more than `deadline_s` (default `METRIC_DEADLINE_S`) over the
    answers raises `MetricFailed`."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        return {}
    results: dict[str, float] = {}
    for spec, key in zip(specs, metric_keys(specs)):
        if isinstance(spec, LlmJudge) or key in results:
            continue
        results[key] = _mean_score(spec, key, predictions, references,
                                   METRIC_DEADLINE_S if deadline_s is None else deadline_s)
    return results


def _mean_score(spec: MetricSpec, key: str, predictions: Sequence[str], references: Sequence[str],
                deadline_s: float) -> float:
    """One metric's mean over the answers, checked against its deadline after each answer (every
    single answer is bounded: RE2 is linear, answers are at most max_new_tokens long)."""
    started = time.monotonic()
    total = 0.0
    for done, (prediction, reference) in enumerate(zip(predictions, references), start=1):
        try:
            total += score(spec, prediction, reference)
        except Exception as exc:  # noqa: BLE001 - whatever a tenant's metric trips on is the tenant's
            raise MetricFailed("eval_metric_failed", f"eval metric {key} ({spec.name}) failed on answer {done}: "
                               f"{type(exc).__name__}") from None
        if time.monotonic() - started > deadline_s:
            raise MetricFailed("eval_metric_timeout", f"eval metric {key} ({spec.name}) ran past its "
                               f"{deadline_s:g} s deadline after {done} of {len(predictions)} answers; "
                               "simplify the metric or lower eval.max_examples") from None
    return total / len(predictions)


# --- LLM as judge --------------------------------------------------------------------------------------------

JUDGE_SYSTEM_PROMPT = (
    "You are an impartial judge. You are shown a question, possibly a reference answer, and two candidate "
    "answers labelled A and B. Decide which candidate answers the question better. Ignore the order in which "
    "they are shown and their length; judge only by the criteria given. Reply with exactly one word: A if the "
    "first candidate is better, B if the second candidate is better, or TIE if neither is better."
)
DEFAULT_CRITERIA = ("Correctness (agreement with the reference answer when one is given), "
                    "then helpfulness and concision.")

# A, B or TIE standing alone (not inside a word such as "Answer" or "TIED")
_VERDICT_TOKEN = re.compile(r"(?<![A-Za-z0-9])(tie|a|b)(?![A-Za-z0-9])", re.IGNORECASE)


def parse_verdict(reply: str) -> str | None:
    """"A", "B" or "TIE": the first standalone verdict token, case-insensitive; None when there is none.
    Inside a sentence a lowercase "a" is the English article, so only a capital A counts there."""
    bare = re.sub(r"[^A-Za-z]", "", reply).upper()
    if bare in ("A", "B", "TIE"):
        return bare
    for match in _VERDICT_TOKEN.finditer(reply):
        if match.group(1) == "a":
            continue
        return match.group(1).upper()
    return None


def _judge_messages(spec: LlmJudge, prompt: str, reference: str | None, first: str, second: str) -> list[dict]:
    parts = [f"Question:\n{prompt}"]
    if reference is not None:
        parts.append(f"Reference answer:\n{reference}")
    parts.append(f"Criteria:\n{spec.criteria or DEFAULT_CRITERIA}")
    parts.append(f"Answer A:\n{first}")
    parts.append(f"Answer B:\n{second}")
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


@dataclass(frozen=True)
class PairwiseJudgement:
    """Both verdicts of one example; an unreadable reply counts as TIE and is counted in `unparseable`."""

    verdict_base_first: str
    """The verdict with the base answer as A and the fine-tuned one as B."""
    verdict_tuned_first: str
    """The verdict with the fine-tuned answer as A and the base one as B."""
    replies: tuple[str, str]
    """The judge's raw replies, in the order above."""
    unparseable: int
    """How many of the two replies held no A, B or TIE."""

    @property
    def score(self) -> float:
        """For the fine-tuned model: 1 when it wins both orders, 0 when it loses both, 0.5 otherwise."""
        tuned_wins = (self.verdict_base_first == "B") + (self.verdict_tuned_first == "A")
        tuned_loses = (self.verdict_base_first == "A") + (self.verdict_tuned_first == "B")
        if tuned_wins == 2:
            return 1.0
        if tuned_loses == 2:
            return 0.0
        return 0.5


def _ask_judge(spec: LlmJudge, messages: list[dict], client: httpx.Client | None) -> str:
    try:
        return complete(spec.target, messages, client=client)
    except ChatEndpointError as exc:
        raise JudgeError(f"LLM judge {spec.model!r}: {exc}") from None


def judge_both_orders(spec: LlmJudge, prompt: str, reference: str | None, answer_base: str, answer_tuned: str,
                      *, client: httpx.Client | None = None) -> PairwiseJudgement:
    """Ask the judge with the base answer first, then with the fine-tuned answer first."""
    with contextlib.ExitStack() as stack:
        # one connection for both questions unless the caller brings its own client
        http = client if client is not None else stack.enter_context(open_client(spec.target))
        replies = (_ask_judge(spec, _judge_messages(spec, prompt, reference, answer_base, answer_tuned), http),
                   _ask_judge(spec, _judge_messages(spec, prompt, reference, answer_tuned, answer_base), http))
    verdicts = [parse_verdict(reply) for reply in replies]
    for reply, verdict in zip(replies, verdicts):
        if verdict is None:
            log.warning("LLM judge %s gave no A/B/TIE verdict (counted as a tie): %.200r", spec.model, reply)
    return PairwiseJudgement(verdicts[0] or "TIE", verdicts[1] or "TIE", replies,
                             sum(verdict is None for verdict in verdicts))


def judge_pairwise(spec: LlmJudge, prompt: str, reference: str | None, answer_base: str, answer_tuned: str,
                   *, client: httpx.Client | None = None) -> float:
    """The fine-tuned answer's score against the base answer in [0, 1] (see PairwiseJudgement.score);
    the mean over examples is task.llm_judge_win_rate. Raises JudgeError when the judge cannot be asked."""
    return judge_both_orders(spec, prompt, reference, answer_base, answer_tuned, client=client).score
