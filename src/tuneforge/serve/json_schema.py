"""Tenants' JSON Schemas (`response_format` json_schema, a tool's `parameters`), taken with
bounded work and never fetching anything.

What went wrong with them as plain `jsonschema` input: a `$ref` to `http://127.0.0.1:...` or
`file:///...` was fetched by jsonschema's deprecated remote resolution (past the egress policy);
`{"$ref": "#"}` recursed until Python's stack gave out (500); twenty definitions each naming the
next twice (`anyOf` of two `$ref`s) made one answer's validation try 2^20 branches (45 s of a
worker, GBs of errors); a `pattern` like `(a+)+$` backtracks for ever in Python's `re`.

`check_schema` refuses, with a 400 naming the field, a schema that:
- is larger than `MAX_SCHEMA_BYTES` as JSON, nests subschemas deeper than `MAX_SCHEMA_DEPTH`,
  holds more than `MAX_SCHEMA_SUBSCHEMAS` subschemas or `MAX_SCHEMA_REFS` references;
- names a `$ref` that is not a JSON pointer into the document itself (`#`, `#/$defs/a`): no
  URL, no file, no other document; `$dynamicRef`/`$recursiveRef`, and an `$id` below the root
  (which would move what `#` means), are refused for the same reason;
- refers to itself through its `$ref`s (recursive schemas are not supported), or grows past
  `MAX_EXPANDED_SUBSCHEMAS` subschemas once every `$ref` is replaced by what it names;
- has a `pattern` (or a `patternProperties` name) that RE2 cannot run in linear time;
- names a `$schema` jsonschema does not know.
`check_dialect` then checks a schema that answers are checked against under its dialect's
meta-schema; it costs far more (jsonschema's meta-schemas are large), so it runs in a thread.

`first_problem` checks an answer against a checked schema: references resolve in a registry
whose retrieval refuses every URI (so nothing is ever fetched, whatever slipped past), patterns
run in RE2, and every keyword evaluated counts against `MAX_VALIDATION_STEPS`; past it the
answer is refused (`SchemaRefused`) instead of the worker working on.
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import jsonschema
import re2
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from tuneforge.domain.errors import invalid

MAX_SCHEMA_BYTES = 64 * 1024  # one schema as compact JSON
MAX_SCHEMA_DEPTH = 32  # subschemas within subschemas
MAX_SCHEMA_SUBSCHEMAS = 2048  # subschemas written in the document
MAX_SCHEMA_REFS = 256  # $ref keywords in the document
MAX_EXPANDED_SUBSCHEMAS = 8192  # subschemas once every $ref is replaced by its target
MAX_VALIDATION_STEPS = 100_000  # keywords evaluated to check one answer
MAX_PATTERN_CHARS = 1024  # one `pattern` or `patternProperties` name
RE2_MAX_MEMORY_BYTES = 8 * 1024 * 1024  # what RE2 may use for one compiled pattern

# Keywords whose value is one subschema, a list of them, or a map of names to them. Everything
# else (enum, const, default, examples, required, ...) is data and never read as a schema.
_ONE = frozenset({"additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if", "then",
                  "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema", "items"})
_MANY = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
_DYNAMIC_REFS = ("$dynamicRef", "$recursiveRef")


class SchemaRefused(Exception):
    """An answer could not be checked against the schema: `code` "schema_too_complex" past
    MAX_VALIDATION_STEPS keywords; "invalid_schema" for a reference outside the document or a
    keyword value jsonschema cannot apply (both refused before, by `check_schema` and
    `check_dialect`: this is the backstop, never a 500)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class _Node:
    schema: dict
    path: str
    children: list[int] = field(default_factory=list)  # id() of the subschemas it holds
    ref: int | None = None  # id() of the subschema its $ref names


def check_schema(schema: Any, param: str) -> None:
    """Raises a 400 naming `param` (or the field inside it) for a schema the API will not take."""
    if not isinstance(schema, dict):
        raise invalid(f"{param} must be a JSON Schema object", param=param)
    size_bytes = json_size_bytes(schema)
    if size_bytes > MAX_SCHEMA_BYTES:
        raise invalid(f"{param} is {size_bytes} bytes of JSON; a schema may hold at most {MAX_SCHEMA_BYTES}",
                      param=param, code="schema_too_large")
    # without $schema: the latest draft; with one jsonschema does not know, nothing (never fetched)
    validator_class = jsonschema.validators.validator_for(
        schema, default=None if "$schema" in schema else jsonschema.validators.validator_for({}))
    if validator_class is None:
        raise invalid(f"{param}.$schema names a dialect this server does not know", param=f"{param}.$schema")
    nodes = _subschemas(schema, param)
    _link_refs(schema, nodes, param)
    _bound_expansion(id(schema), nodes, param)


def check_dialect(schema: dict, param: str) -> None:
    """Raises a 400 naming `param` for a (bounded, `check_schema`ed) schema that is not valid
    under its dialect's meta-schema: what answers are checked against must be one jsonschema can
    apply. Pure CPU, about 0.2 ms per subschema (some 400 ms at MAX_SCHEMA_SUBSCHEMAS): callers on
    the event loop run it in a thread."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise invalid(f"{param} is not a valid JSON Schema: {exc.message[:200]}", param=param) from None


def json_size_bytes(schema: Any) -> int:
    """`schema` as compact UTF-8 JSON, in bytes (what MAX_SCHEMA_BYTES bounds)."""
    return len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode(errors="surrogatepass"))


def _subschemas(root: dict, param: str) -> dict[int, _Node]:
    """Every subschema object of the document by id(), each with the ones it holds; refuses what
    is too deep or too many, the references that are not local, and the patterns RE2 cannot run."""
    nodes: dict[int, _Node] = {}
    refs = 0
    stack: list[tuple[dict, str, int]] = [(root, param, 0)]
    while stack:
        schema, path, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise invalid(f"{path} nests subschemas more than {MAX_SCHEMA_DEPTH} deep", param=path,
                          code="schema_too_deep")
        if len(nodes) >= MAX_SCHEMA_SUBSCHEMAS:
            raise invalid(f"{param} holds more than {MAX_SCHEMA_SUBSCHEMAS} subschemas", param=param,
                          code="schema_too_large")
        node = nodes[id(schema)] = _Node(schema, path)
        refs += _check_keywords(schema, path, is_root=schema is root)
        if refs > MAX_SCHEMA_REFS:
            raise invalid(f"{param} holds more than {MAX_SCHEMA_REFS} $ref", param=param, code="schema_too_large")
        for child, child_path in _children(schema, path):
            node.children.append(id(child))
            stack.append((child, child_path, depth + 1))
    return nodes


def _children(schema: dict, path: str) -> list[tuple[dict, str]]:
    """The subschema objects directly inside `schema` (booleans hold none), with their paths."""
    found: list[tuple[dict, str]] = []
    for keyword, value in schema.items():
        if keyword in _ONE and isinstance(value, dict):
            found.append((value, f"{path}.{keyword}"))
        elif keyword in _MANY and isinstance(value, list):
            found.extend((item, f"{path}.{keyword}.{index}") for index, item in enumerate(value)
                         if isinstance(item, dict))
        elif keyword in _MAP and isinstance(value, dict):
            found.extend((item, f"{path}.{keyword}.{name}") for name, item in value.items() if isinstance(item, dict))
    return found


def _check_keywords(schema: dict, path: str, *, is_root: bool) -> int:
    """Refuses the keywords of one subschema that could reach outside the document or run
    without bound; answers how many $ref it holds (0 or 1)."""
    for keyword in _DYNAMIC_REFS:
        if keyword in schema:
            raise invalid(f"{path}.{keyword} is not supported; use $ref to a local definition ('#/$defs/...')",
                          param=f"{path}.{keyword}", code="schema_ref_not_allowed")
    if not is_root and isinstance(schema.get("$id"), str):
        raise invalid(f"{path}.$id: only the root schema may have an $id (it would change what its $refs "
                      "point at)", param=f"{path}.$id", code="schema_ref_not_allowed")
    if isinstance(schema.get("pattern"), str):
        _check_pattern(schema["pattern"], f"{path}.pattern")
    if isinstance(schema.get("patternProperties"), dict):
        for pattern in schema["patternProperties"]:
            _check_pattern(pattern, f"{path}.patternProperties")
    ref = schema.get("$ref")
    if ref is None:
        return 0
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise invalid(f"{path}.$ref must point into this schema ('#/$defs/name'); references to URLs, files "
                      "or other documents are not followed", param=f"{path}.$ref", code="schema_ref_not_allowed")
    return 1


def _check_pattern(pattern: str, path: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise invalid(f"{path} is longer than {MAX_PATTERN_CHARS} characters", param=path, code="invalid_pattern")
    try:
        _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise invalid(f"{path} is not a pattern RE2 can run ({reason}); backreferences and lookaround are not "
                      "supported", param=path, code="invalid_pattern") from None


@lru_cache(maxsize=512)  # an answer's strings are many, its schema's patterns few
def _compiled(pattern: str) -> Any:
    options = re2.Options()
    options.max_mem = RE2_MAX_MEMORY_BYTES
    options.log_errors = False  # a tenant's bad pattern is its 400, not a line in the operator's log
    return re2.compile(pattern, options)


def _link_refs(root: dict, nodes: dict[int, _Node], param: str) -> None:
    """Points each $ref's node at the subschema it names; refuses one that names none."""
    for node in nodes.values():
        ref = node.schema.get("$ref")
        if ref is None:
            continue
        target = _pointed(root, ref)
        where = f"{node.path}.$ref"
        if target is None or not isinstance(target, (dict, bool)):
            raise invalid(f"{where} {ref!r} does not point at a subschema of {param}", param=where,
                          code="schema_ref_not_allowed")
        if isinstance(target, dict):
            if id(target) not in nodes:
                raise invalid(f"{where} {ref!r} points inside data (enum, const, ...), not at a subschema",
                              param=where, code="schema_ref_not_allowed")
            node.ref = id(target)


def _pointed(root: Any, ref: str) -> Any:
    """What the fragment JSON pointer `ref` ('#', '#/a/b') names in `root` (RFC 6901), or None."""
    current = root
    for raw in unquote(ref[1:]).split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            return None
    return current


def _bound_expansion(root_id: int, nodes: dict[int, _Node], param: str) -> None:
    """Refuses a schema whose $refs form a cycle, or that names more than MAX_EXPANDED_SUBSCHEMAS
    subschemas once each $ref is replaced by its target (what validation may have to visit).
    A depth-first walk, without recursion: a chain of $refs may be longer than Python's stack."""
    size: dict[int, int] = {}
    on_path: set[int] = {root_id}
    stack = [(root_id, iter(_edges(nodes[root_id])))]
    while stack:
        node_id, edges = stack[-1]
        child = next(edges, None)
        if child is None:
            stack.pop()
            on_path.discard(node_id)
            total = 1 + sum(size[edge] for edge in _edges(nodes[node_id]))
            if total > MAX_EXPANDED_SUBSCHEMAS:
                raise invalid(f"{param} grows to more than {MAX_EXPANDED_SUBSCHEMAS} subschemas once its $refs are "
                              f"followed (at {nodes[node_id].path})", param=param, code="schema_too_large")
            size[node_id] = total
        elif child in on_path:  # only a $ref can lead back to a schema that holds it
            where = f"{nodes[node_id].path}.$ref"
            raise invalid(f"{where} makes the schema recursive, which is not supported", param=where,
                          code="schema_recursive")
        elif child not in size:
            on_path.add(child)
            stack.append((child, iter(_edges(nodes[child]))))


def _edges(node: _Node) -> list[int]:
    return node.children if node.ref is None else [*node.children, node.ref]


# ---- checking answers ---------------------------------------------------------------------------

_STEPS_LEFT: contextvars.ContextVar[list[int]] = contextvars.ContextVar("schema_steps_left")
_BOUNDED: dict[type, type] = {}


def first_problem(schema: dict, instance: Any) -> str | None:
    """The first way `instance` fails the checked `schema` (None: it matches). Raises
    SchemaRefused past MAX_VALIDATION_STEPS. Pure CPU: callers on the event loop run it in a thread."""
    validator = _bounded(jsonschema.validators.validator_for(schema))(schema, registry=_LOCAL_ONLY)
    token = _STEPS_LEFT.set([MAX_VALIDATION_STEPS])
    try:
        error = next(validator.iter_errors(instance), None)
    except Unresolvable as exc:
        raise SchemaRefused("invalid_schema", f"a $ref did not resolve inside the schema ({exc})") from None
    except jsonschema.exceptions.UnknownType as exc:
        raise SchemaRefused("invalid_schema", f"unknown type {exc.type!r}") from None
    finally:
        _STEPS_LEFT.reset(token)
    return None if error is None else error.message[:200]


def _refuse_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


# Every reference resolves inside the schema's own document; a URI outside it is never fetched.
_LOCAL_ONLY: Registry = Registry(retrieve=_refuse_retrieval)


def _bounded(base: type) -> type:
    """`base` with each keyword counted against the answer's budget, and patterns run by RE2."""
    if base not in _BOUNDED:
        keywords = {name: _counted(function) for name, function in base.VALIDATORS.items()}
        if "pattern" in keywords:
            keywords["pattern"] = _counted(_re2_pattern)
        if "patternProperties" in keywords:
            keywords["patternProperties"] = _counted(_re2_pattern_properties)
        _BOUNDED[base] = jsonschema.validators.extend(base, validators=keywords)
    return _BOUNDED[base]


def _counted(function: Any) -> Any:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        left = _STEPS_LEFT.get()
        left[0] -= 1
        if left[0] < 0:
            raise SchemaRefused("schema_too_complex", f"checking an answer took more than {MAX_VALIDATION_STEPS} "
                                "steps; simplify the schema (fewer anyOf/oneOf branches, fewer $refs)")
        return function(validator, value, instance, schema)

    return keyword


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance[:80]!r} does not match {pattern!r}")


def _re2_pattern_properties(validator: Any, patterns: dict, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        compiled = _compiled(pattern)
        for name, value in instance.items():
            if compiled.search(name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)
