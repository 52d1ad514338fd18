"""Recognise the shape of one record and normalise it into an `Example`.

Shapes (the key that decides is in brackets; checked in this order):

- kto [`label`, or `output`]: `{input, output, label}` or `{prompt,
  completion, label}`, a completion marked desirable (true) or not (a shape
  beyond the built-ins, `method_shapes`: recognised first);
- preference, OpenAI DPO [`input`, `preferred_output`, `non_preferred_output`]:
  `{input: {messages, tools?}, preferred_output: [assistant message],
  non_preferred_output: [assistant message]}`;
- preference, pairs [`chosen`, `rejected`]: `{prompt, chosen, rejected}` where
  prompt is a string (one user turn) or a list of messages, and chosen/rejected
  are strings, one assistant message, or a list holding one;
- chat [`messages`]: OpenAI chat fine-tuning format, `{messages, tools?,
  parallel_tool_calls?}`;
- instruction [`prompt`, `completion`]: `{prompt, completion}` strings;
- text [`text`]: `{text}`.

`normalize` raises a `DataIssue` (code, `field`, short `excerpt`) for the first
problem in a record and returns non-fatal ones as warnings. Codes are listed
with their meaning in `tuneforge.data.codes`.

The normalised example reuses the record's objects (messages are the same
dicts, with content parts joined into one string), so a record must not be
shared with anything else once normalised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneforge.data.example import DataIssue, Example
from tuneforge.data.messages import (
    conversation,
    excerpt,
    issue,
    known_keys,
    message_role,
    optional_bool,
    tool_definitions,
)

CHAT_KEYS = frozenset({"messages", "tools", "parallel_tool_calls"})
INSTRUCTION_KEYS = frozenset({"prompt", "completion"})
DPO_KEYS = frozenset({"input", "preferred_output", "non_preferred_output"})
_DPO_INPUT_KEYS = frozenset({"messages", "tools", "parallel_tool_calls"})
PAIR_KEYS = frozenset({"prompt", "chosen", "rejected"})
TEXT_KEYS = frozenset({"text"})
KNOWN_KEYS = CHAT_KEYS | INSTRUCTION_KEYS | DPO_KEYS | PAIR_KEYS | TEXT_KEYS

# What each kind looks like, for messages that tell the user what to write.
SHAPE_HELP: dict[str, str] = {
    "chat": "{messages: [...]} (OpenAI chat)",
    "instruction": "{prompt, completion}",
    "preference": "{input, preferred_output, non_preferred_output} (OpenAI DPO) or {prompt, chosen, rejected}",
    "text": "{text}",
}


@dataclass(frozen=True)
class Shape:
    """A data shape beyond the built-in ones (`method_shapes`). Its records are
    recognised before the built-in shapes, so its deciding key must be one no built-in
    shape has (e.g. KTO's `label`)."""

    kind: str  # the `Example.kind` its records get
    help: str  # what a record looks like, for messages that tell the user what to write
    keys: frozenset[str]  # every top-level key a record may have (columns of a table)
    json_keys: frozenset[str]  # those whose CSV/Parquet text cells hold JSON
    claims: Callable[[dict[str, Any]], bool]  # whether a record is of this shape
    normalize: Callable[[dict[str, Any], int, list[DataIssue]], Example]  # raises DataIssue
    to_record: Callable[[Example], dict[str, Any]]  # the prepared-dataset line the trainer reads


def method_shapes() -> tuple[Shape, ...]:
    """The shapes beyond the built-in ones that some method trains on, recognised first.
    They live here, not with their method: an upload is checked before any method is named."""
    return (KTO, PROMPT)


def known_keys_all() -> frozenset[str]:
    """Every top-level key some shape uses: a table needs at least one such column."""
    return KNOWN_KEYS.union(*(shape.keys for shape in method_shapes()))


def json_keys_all(builtin: frozenset[str]) -> frozenset[str]:
    """`builtin` JSON columns plus those of the methods' shapes."""
    return builtin.union(*(shape.json_keys for shape in method_shapes()))


def shape_help() -> dict[str, str]:
    return {**SHAPE_HELP, **{shape.kind: shape.help for shape in method_shapes()}}


def normalize(record: dict[str, Any], line: int, skip: frozenset[str] = frozenset()) -> tuple[Example, list[DataIssue]]:
    """The `Example` for one record and its warnings; raises `DataIssue` on an error. `skip`: kinds of
    `method_shapes` not to recognise (the method cannot use them, or the file is of another kind), so
    that e.g. a chat whose last turn is the user's gets the chat's own error rather than being a prompt."""
    plain = plain_chat(record, line)
    if plain is not None:
        return plain, []
    warnings: list[DataIssue] = []
    for shape in method_shapes():
        if shape.kind not in skip and shape.claims(record):
            return shape.normalize(record, line, warnings), warnings
    if "input" in record or "preferred_output" in record or "non_preferred_output" in record:
        known_keys(record, DPO_KEYS, "an OpenAI DPO preference example", line)
        return _dpo_preference(record, line, warnings), warnings
    if "chosen" in record or "rejected" in record:
        known_keys(record, PAIR_KEYS, "a {prompt, chosen, rejected} preference example", line)
        return _pair_preference(record, line, warnings), warnings
    if "messages" in record:
        known_keys(record, CHAT_KEYS, "a chat example", line)
        return _chat(record, line, warnings), warnings
    if "prompt" in record or "completion" in record:
        known_keys(record, INSTRUCTION_KEYS, "an instruction example", line)
        return _instruction(record, line, warnings), warnings
    if "text" in record:
        known_keys(record, TEXT_KEYS, "a text example", line)
        return _text(record, line), warnings
    found = ", ".join(sorted(map(str, record))) or "none"
    expected = "; ".join(f"{help_text} ({kind})" for kind, help_text in shape_help().items())
    raise issue("unknown_shape", f"no supported shape; found keys: {found}. Expected one of: {expected}",
                 line, value=record)


@dataclass(frozen=True)
class MethodFit:
    """What the data checks need of a training method: its name (for messages) and the example
    kinds it trains on. The method catalogue makes it (`tuneforge.methods.TrainingMethod.fit`)."""

    name: str
    kinds: tuple[str, ...]
    required_fields: tuple[str, ...] = ()  # fields every example must hold beyond its shape (a grader reads them)


def skipped_kinds(method: MethodFit | None, file_kind: str | None) -> frozenset[str]:
    """The method shapes a record is not recognised as: those `method` does not train on, and a
    prompt in a file of chats (a chat that ends with the user's turn is a chat's mistake there)."""
    skip = {shape.kind for shape in method_shapes() if method is not None and shape.kind not in method.kinds}
    if file_kind == "chat":
        skip.add(PROMPT.kind)
    return frozenset(skip)


def check_required_fields(example: Example, method: MethodFit) -> None:
    """Raise `missing_field` for the first field `method` needs that the example lacks."""
    present = example.item or {}
    for name in method.required_fields:
        if name not in present:
            raise issue("missing_field", f"the line has no field '{name}', which the grader reads as "
                                         f"{{{{item.{name}}}}}", example.line, name)


def check_method(kind: str, method: MethodFit, line: int = 0) -> None:
    """Raise `shape_mismatch` unless `method` trains on examples of `kind`."""
    if kind in method.kinds:
        return
    help_by_kind = shape_help()
    needs = " or ".join(f"{accepted_kind} {help_by_kind[accepted_kind]}" for accepted_kind in method.kinds)
    raise issue("shape_mismatch", f"method '{method.name}' needs {needs} examples; this file holds {kind} examples",
                 line)


# --- chat -------------------------------------------------------------------

_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})
_MAX_PLAIN_ORDERS = 4096
_plain_orders: dict[tuple[str, ...], bool] = {}  # role sequences judged so far (bounded)


def plain_chat(record: dict[str, Any], line: int) -> Example | None:
    """The example of the commonest record — `{messages}` alone, every turn a
    `{role, content}` with non-blank text, no tools, weights or tool turns, in
    an order the full check accepts — found with a few tests per turn; None
    for anything else, which then takes the full check (`normalize`). What it
    returns is what `_chat` returns for such a record: no method shape claims
    it (it has no `label`/`output`, and ends with the assistant's turn)."""
    if len(record) != 1:
        return None
    messages = record.get("messages")
    if type(messages) is not list or not messages:
        return None
    roles = []
    for message in messages:
        if type(message) is not dict or len(message) != 2:
            return None
        content, role = message.get("content"), message.get("role")
        if type(content) is not str or type(role) is not str or not content or content.isspace():
            return None
        roles.append(role)
    order = tuple(roles)
    valid = _plain_orders.get(order)
    if valid is None:
        valid = _plain_order(order)
        if len(_plain_orders) < _MAX_PLAIN_ORDERS:
            _plain_orders[order] = valid
    return Example(line=line, kind="chat", messages=messages) if valid else None


def _plain_order(roles: tuple[str, ...]) -> bool:
    """Whether `conversation` accepts these roles (without tool turns): a system or developer
    turn only first, every assistant turn right after a user turn, the assistant's turn last."""
    if not set(roles) <= _PLAIN_ROLES or roles[-1] != "assistant":
        return False
    return all((role != "assistant" or (index > 0 and roles[index - 1] == "user"))
               and (role in ("user", "assistant") or index == 0) for index, role in enumerate(roles))



def _chat(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    tools, tool_names = tool_definitions(record.get("tools"), "tools", line)
    optional_bool(record, "parallel_tool_calls", "parallel_tool_calls", line)
    messages = conversation(record["messages"], "messages", line, warnings, tool_names, prompt_only=False)
    if record.get("parallel_tool_calls") is False:
        _one_call_per_turn(messages, "messages", line)
    return Example(line=line, kind="chat", messages=messages, tools=tools)


def _one_call_per_turn(messages: list[dict[str, Any]], field: str, line: int) -> None:
    """With `parallel_tool_calls: false` an assistant turn makes at most one tool call: the model
    would otherwise learn what the example forbids it."""
    for index, message in enumerate(messages):
        calls = message.get("tool_calls") or []
        if len(calls) > 1:
            raise issue("invalid_tool_call", f"{field}[{index}] makes {len(calls)} tool calls, but "
                        "'parallel_tool_calls' is false", line, f"{field}[{index}].tool_calls")


# --- instruction and text -------------------------------------------------------


def _instruction(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    for key in ("prompt", "completion"):
        if key not in record:
            raise issue("missing_key", f"an instruction example needs '{key}'", line, key)
        if type(record[key]) is not str:
            raise issue("invalid_type", f"'{key}' must be a string", line, key, record[key])
    prompt, completion = record["prompt"], record["completion"]
    if not completion.strip():
        raise issue("empty_completion", "'completion' is empty", line, "completion", completion)
    if not prompt.strip():
        warnings.append(DataIssue("empty_prompt", "'prompt' is empty", line=line, field="prompt",
                                  excerpt=excerpt(prompt), severity="warning"))
    return Example(line=line, kind="instruction", prompt=prompt, completion=completion)


def _text(record: dict[str, Any], line: int) -> Example:
    text = record["text"]
    if type(text) is not str:
        raise issue("invalid_type", "'text' must be a string", line, "text", text)
    if not text.strip():
        raise issue("empty_text", "'text' is empty", line, "text", text)
    return Example(line=line, kind="text", text=text)


# --- preference -------------------------------------------------------------------


def _dpo_preference(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    for key in ("input", "preferred_output", "non_preferred_output"):
        if key not in record:
            raise issue("missing_key", f"an OpenAI DPO example needs '{key}'", line, key)
    messages, tools, tool_names = prompt_input(record["input"], line, warnings)
    chosen = one_answer(record["preferred_output"], "preferred_output", line, tool_names)
    rejected = one_answer(record["non_preferred_output"], "non_preferred_output", line, tool_names)
    if record["input"].get("parallel_tool_calls") is False:
        _one_call_per_turn([chosen], "preferred_output", line)
        _one_call_per_turn([rejected], "non_preferred_output", line)
    _check_distinct(chosen, rejected, "non_preferred_output", line)
    return Example(line=line, kind="preference", messages=messages, tools=tools, chosen=chosen, rejected=rejected)


def prompt_input(prompt: Any, line: int, warnings: list[DataIssue]) -> tuple[list[dict[str, Any]],
                                                                             list[dict[str, Any]] | None, set[str]]:
    """An OpenAI-style `input` object, `{messages, tools?, parallel_tool_calls?}`, whose
    conversation ends with a user (or tool) turn: (messages, tools, tool names)."""
    if type(prompt) is not dict:
        raise issue("invalid_type", "'input' must be an object with 'messages'", line, "input", prompt)
    known_keys(prompt, _DPO_INPUT_KEYS, "the input of a preference example", line, "input")
    if "messages" not in prompt:
        raise issue("missing_key", "'input' needs 'messages'", line, "input.messages")
    tools, tool_names = tool_definitions(prompt.get("tools"), "input.tools", line)
    optional_bool(prompt, "parallel_tool_calls", "input.parallel_tool_calls", line)
    messages = conversation(prompt["messages"], "input.messages", line, warnings, tool_names, prompt_only=True)
    return messages, tools, tool_names


def _pair_preference(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    for key in ("prompt", "chosen", "rejected"):
        if key not in record:
            raise issue("missing_key", f"a preference example needs '{key}'", line, key)
    prompt = record["prompt"]
    if type(prompt) is str:
        messages = [{"role": "user", "content": prompt}]
        if not prompt.strip():
            warnings.append(DataIssue("empty_turn", "'prompt' is empty", line=line, field="prompt",
                                      excerpt=excerpt(prompt), severity="warning"))
    elif type(prompt) is list:
        messages = conversation(prompt, "prompt", line, warnings, None, prompt_only=True)
    else:
        raise issue("invalid_type", "'prompt' must be a string or a list of messages", line, "prompt", prompt)
    chosen = _pair_answer(record["chosen"], "chosen", line)
    rejected = _pair_answer(record["rejected"], "rejected", line)
    _check_distinct(chosen, rejected, "rejected", line)
    return Example(line=line, kind="preference", messages=messages, chosen=chosen, rejected=rejected)


def _pair_answer(value: Any, field: str, line: int) -> dict[str, Any]:
    if type(value) is str:
        if not value.strip():
            raise issue("empty_turn", f"'{field}' is an empty answer", line, field, value)
        return {"role": "assistant", "content": value}
    if type(value) is dict:
        return _answer_message(value, field, line, None)
    if type(value) is list:
        return one_answer(value, field, line, None)
    raise issue("invalid_type", f"'{field}' must be a string, an assistant message or a list holding one",
                 line, field, value)


def one_answer(value: Any, field: str, line: int, tool_names: set[str] | None) -> dict[str, Any]:
    if type(value) is not list:
        raise issue("invalid_type", f"'{field}' must be a list holding one assistant message", line, field, value)
    if len(value) != 1:
        raise issue("invalid_preference", f"'{field}' must hold exactly one assistant message; it holds "
                     f"{len(value)}", line, field, value)
    return _answer_message(value[0], f"{field}[0]", line, tool_names)


def _answer_message(message: Any, field: str, line: int, tool_names: set[str] | None) -> dict[str, Any]:
    role = message_role(message, field, line, tool_names, prompt_only=True)
    if role != "assistant":
        raise issue("invalid_preference", f"{field} must be an assistant message, not {role}", line,
                     f"{field}.role", role)
    content = message["content"]
    if "tool_calls" not in message and (content is None or not content.strip()):
        raise issue("empty_turn", f"{field} is an empty answer", line, f"{field}.content", content)
    return message


def _check_distinct(chosen: dict[str, Any], rejected: dict[str, Any], field: str, line: int) -> None:
    same_text = (chosen["content"] or "").strip() == (rejected["content"] or "").strip()
    if same_text and chosen.get("tool_calls") == rejected.get("tool_calls"):
        raise issue("identical_preference", "the preferred and rejected answers are identical; the pair "
                     "teaches nothing", line, field, chosen["content"])


# --- kto (labelled completions, `methods/kto.py`) ------------------------------------

_KTO_KEYS = frozenset({"input", "output", "label", "prompt", "completion"})
_KTO_HELP = "{input, output, label} or {prompt, completion, label} (KTO: label true = desirable)"


def _kto_claims(record: dict[str, Any]) -> bool:
    return "label" in record or "output" in record


def _kto_normalize(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    openai_style = "input" in record or "output" in record
    allowed = frozenset({"input", "output", "label"}) if openai_style else frozenset({"prompt", "completion", "label"})
    known_keys(record, allowed, "a KTO example", line)
    for key in sorted(allowed):
        if key not in record:
            raise issue("missing_key", f"a KTO example needs '{key}'", line, key)
    label = record["label"]
    if type(label) is not bool:
        raise issue("invalid_label", "'label' must be true (desirable) or false (undesirable)", line,
                           "label", label)
    tools = None
    if openai_style:
        messages, tools, tool_names = prompt_input(record["input"], line, warnings)
        answer = one_answer(record["output"], "output", line, tool_names)
    else:
        messages = _kto_prompt_messages(record["prompt"], line, warnings)
        answer = _kto_completion(record["completion"], line)
    return Example(line=line, kind="kto", messages=messages, tools=tools,
                   chosen=answer if label else None, rejected=None if label else answer)


def _kto_prompt_messages(prompt: Any, line: int, warnings: list[DataIssue]) -> list[dict[str, Any]]:
    if type(prompt) is str:
        if not prompt.strip():
            raise issue("empty_turn", "'prompt' is empty", line, "prompt", prompt)
        return [{"role": "user", "content": prompt}]
    if type(prompt) is list:
        return prompt_input({"messages": prompt}, line, warnings)[0]
    raise issue("invalid_type", "'prompt' must be a string or a list of messages", line, "prompt", prompt)


def _kto_completion(value: Any, line: int) -> dict[str, Any]:
    if type(value) is not str:
        raise issue("invalid_type", "'completion' must be a string", line, "completion", value)
    if not value.strip():
        raise issue("empty_turn", "'completion' is an empty answer", line, "completion", value)
    return {"role": "assistant", "content": value}


def _kto_to_record(example: Example) -> dict[str, Any]:
    prompt: dict[str, Any] = {"messages": example.messages}
    if example.tools:
        prompt["tools"] = example.tools
    desirable = example.chosen is not None
    return {"input": prompt, "output": [example.chosen if desirable else example.rejected], "label": desirable}


KTO = Shape(kind="kto", help=_KTO_HELP, keys=_KTO_KEYS, json_keys=frozenset({"input", "output"}),
            claims=_kto_claims, normalize=_kto_normalize, to_record=_kto_to_record)


# --- prompt (reinforcement fine-tuning) -------------------------------------

_PROMPT_HELP = ("{messages: [...], ...} whose last message is the user's, with any other fields a grader reads "
                "(reinforcement)")
MAX_ITEM_FIELDS = 256
# a record with these is a preference example gone wrong, not a prompt
_PREFERENCE_KEYS = frozenset({"chosen", "rejected", "preferred_output", "non_preferred_output"})


def _prompt_claims(record: dict[str, Any]) -> bool:
    """A conversation that ends with the user's turn, waiting for the model: what reinforcement samples from."""
    messages = record.get("messages")
    return type(messages) is list and bool(messages) and type(messages[-1]) is dict \
        and messages[-1].get("role") == "user" and not _PREFERENCE_KEYS & record.keys()


def _prompt_normalize(record: dict[str, Any], line: int, warnings: list[DataIssue]) -> Example:
    tools, tool_names = tool_definitions(record.get("tools"), "tools", line)
    messages = conversation(record["messages"], "messages", line, warnings, tool_names, prompt_only=True)
    item = {key: value for key, value in record.items() if key != "messages"}
    if len(item) > MAX_ITEM_FIELDS:
        raise issue("too_many_fields", f"{len(item)} fields besides 'messages'; at most {MAX_ITEM_FIELDS}", line)
    return Example(line=line, kind="prompt", messages=messages, tools=tools, item=item)


def _prompt_to_record(example: Example) -> dict[str, Any]:
    return {**(example.item or {}), "messages": example.messages}


PROMPT = Shape(kind="prompt", help=_PROMPT_HELP, keys=frozenset({"messages"}), json_keys=frozenset({"messages"}),
               claims=_prompt_claims, normalize=_prompt_normalize, to_record=_prompt_to_record)
