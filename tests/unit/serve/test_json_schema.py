"""Tenants' JSON Schemas: nothing outside the document is ever fetched, and every schema that is
taken has bounded size, depth, references, expansion and validation work."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.net import counting_json_server
from tuneforge.domain.errors import ApiError
from tuneforge.serve import json_schema
from tuneforge.serve.json_schema import (
    MAX_EXPANDED_SUBSCHEMAS,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_REFS,
    MAX_SCHEMA_SUBSCHEMAS,
    MAX_VALIDATION_STEPS,
    SchemaRefused,
    check_dialect,
    check_schema,
    first_problem,
)

P = "response_format.json_schema.schema"


def refused(schema) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_schema(schema, P)
    assert caught.value.status_code == 400
    return caught.value


def chained(links: int) -> dict:
    """`links` definitions, each naming the next twice: 2^links paths through them."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that serves a schema and counts every request it gets."""
    with counting_json_server({"type": "string"}) as served:
        yield served


def test_a_remote_reference_is_400_and_never_fetched(listener):
    url, hits = listener
    for schema, param in (({"$ref": f"{url}/s.json"}, f"{P}.$ref"),
                          ({"properties": {"a": {"$ref": f"{url}/s.json#/x"}}}, f"{P}.properties.a.$ref"),
                          ({"$id": f"{url}/root.json", "items": {"$ref": "other.json"}}, f"{P}.items.$ref")):
        error = refused(schema)
        assert (error.param, error.code) == (param, "schema_ref_not_allowed")
    # a nested $id would make '#/...' mean another document
    assert refused({"properties": {"a": {"$id": f"{url}/a.json", "$ref": "#/x"}}}).param == f"{P}.properties.a.$id"
    assert hits == []


def test_validation_resolves_nothing_outside_the_document(listener):
    """Even a schema that never went through check_schema: the registry refuses to retrieve."""
    url, hits = listener
    with pytest.raises(SchemaRefused) as refused:
        first_problem({"$ref": f"{url}/s.json"}, "x")
    assert refused.value.code == "invalid_schema"
    assert hits == []


@pytest.mark.parametrize("ref", ["file:///etc/passwd", "file:///etc/passwd#/x", "/etc/passwd", "urn:x:y", "#anchor"])
def test_file_and_other_references_are_400(ref):
    assert refused({"$ref": ref}).code == "schema_ref_not_allowed"


@pytest.mark.parametrize(("schema", "param"), [
    ({"$ref": "#"}, f"{P}.$ref"),
    ({"properties": {"next": {"$ref": "#"}}}, f"{P}.properties.next.$ref"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}, None),
])
def test_recursive_references_are_400_not_500(schema, param):
    error = refused(schema)
    assert error.code == "schema_recursive"
    assert param is None or error.param == param


def test_chained_definitions_are_refused_by_their_expansion():
    error = refused(chained(20))
    assert error.code == "schema_too_large" and str(MAX_EXPANDED_SUBSCHEMAS) in error.message
    check_schema(chained(8), P)  # 2^8 paths: taken
    assert first_problem(chained(8), "text") is None


def test_size_depth_subschemas_and_refs_are_bounded():
    assert refused({"description": "x" * MAX_SCHEMA_BYTES}).code == "schema_too_large"
    deep: dict = {"type": "object"}
    inner = deep
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        inner["properties"] = {"a": {"type": "object"}}
        inner = inner["properties"]["a"]
    assert refused(deep).code == "schema_too_deep"
    wide = {"anyOf": [{"type": "string"} for _ in range(MAX_SCHEMA_SUBSCHEMAS)]}
    assert refused(wide).code == "schema_too_large"
    refs = {"$defs": {"s": {"type": "string"}}, "anyOf": [{"$ref": "#/$defs/s"} for _ in range(MAX_SCHEMA_REFS + 1)]}
    assert refused(refs).code == "schema_too_large"


def test_references_must_name_a_subschema():
    assert refused({"$ref": "#/$defs/missing"}).param == f"{P}.$ref"
    assert refused({"enum": [{"type": "string"}], "$ref": "#/enum/0"}).code == "schema_ref_not_allowed"


def test_dynamic_references_are_400():
    assert refused({"$dynamicRef": "#meta"}).param == f"{P}.$dynamicRef"
    assert refused({"$recursiveRef": "#"}).param == f"{P}.$recursiveRef"


def test_an_unknown_dialect_is_400_and_a_known_one_is_taken():
    assert refused({"$schema": "http://127.0.0.1:1/meta"}).param == f"{P}.$schema"
    check_schema({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"s": {"type": "string"}},
                  "properties": {"a": {"$ref": "#/definitions/s"}}}, P)


def test_patterns_run_in_linear_time_or_are_400():
    assert refused({"type": "string", "pattern": "(a)\\1"}).code == "invalid_pattern"
    assert refused({"patternProperties": {"(?=x)": {}}}).param == f"{P}.patternProperties"
    catastrophic = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(a+)+$"}}}
    check_schema(catastrophic, P)
    # Python's re would backtrack for ever here; RE2 answers at once
    assert "does not match" in first_problem(catastrophic, {"id": "a" * 100_000 + "b"})


def test_a_property_named_like_a_keyword_is_data_not_a_reference():
    schema = {"type": "object", "properties": {"$ref": {"type": "string"}, "id": {"type": "string"}},
              "examples": [{"$ref": "http://example.com/"}], "required": ["id"]}
    check_schema(schema, P)
    assert first_problem(schema, {"$ref": "x", "id": "y"}) is None
    assert first_problem(schema, {"$ref": 1, "id": "y"}) == "1 is not of type 'string'"


def test_validation_work_is_bounded():
    # each item fails 39 branches 40 ways each before the last branch takes it
    branches = {"type": "array", "items": {"anyOf": [
        {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": 3 if b < 39 else 1}
                                          for i in range(40)}} for b in range(40)]}}
    check_schema(branches, P)
    answer = [{f"p{i}": "a" for i in range(40)}] * 100
    with pytest.raises(SchemaRefused) as refused:
        first_problem(branches, answer)
    assert refused.value.code == "schema_too_complex"
    assert first_problem(branches, answer[:5]) is None  # a small answer is checked in full
    assert first_problem(branches, [*answer[:5], 7]) == "7 is not valid under any of the given schemas"


def test_the_step_budget_is_per_answer():
    schema = {"type": "array", "items": {"type": "integer"}}
    under = list(range(MAX_VALIDATION_STEPS // 4))
    for _ in range(3):
        assert first_problem(schema, under) is None


def test_a_keyword_jsonschema_cannot_apply_is_refused_not_a_500():
    with pytest.raises(SchemaRefused) as refused:
        first_problem({"type": "no-such-type"}, {})
    assert refused.value.code == "invalid_schema"


def test_the_dialect_check_names_the_field():
    with pytest.raises(ApiError) as caught:
        check_dialect({"type": "no-such-type"}, "tools.0.function.parameters")
    assert caught.value.param == "tools.0.function.parameters"
    check_dialect({"type": "object", "properties": {"a": {"type": "integer"}}}, P)


def test_the_module_states_its_bounds():
    assert json_schema.MAX_EXPANDED_SUBSCHEMAS >= json_schema.MAX_SCHEMA_SUBSCHEMAS
