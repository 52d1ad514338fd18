"""Property-based fuzzing of every tenant operation in the OpenAPI document, in process, on a fixed
budget: valid and invalid inputs derived from the schema never answer 5xx, and every answer has a
documented status code, content type and (for JSON) shape.

The schema is `app.openapi()` (not GET /openapi.json, which an operator may close). The admin API
is left out (off without a key; covered by tests/unit/api/test_admin.py); trainer reports are not
in the document. No base model is registered, so a job body that validates still answers 400
(unknown model) and nothing trains.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.api.app import create_app

EXAMPLES_PER_OPERATION = 25  # a fixed budget: about 25-45 s for the whole run on two shared CPUs
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_every_operation_survives_generated_input(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    key = add_tenant(platform, "fuzz")
    app = create_app(platform=platform)
    schema = schemathesis.openapi.from_dict(app.openapi())
    schema.app = app
    auth = {"Authorization": f"Bearer {key}"}
    operations = [result.ok() for result in schema.get_all_operations()
                  if not result.ok().path.startswith("/v1/admin")]
    assert len(operations) > 25
    try:
        for operation in operations:
            strategy = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                                 operation.as_strategy(GenerationMode.NEGATIVE))

            @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def exercise(case) -> None:  # noqa: ANN001 - a schemathesis Case
                case.call_and_validate(headers=auth, checks=CHECKS)

            exercise()
    finally:
        platform.db.dispose()



STATEFUL_STEPS = 12
STATEFUL_SCENARIOS = 30


def test_linked_operations_survive_generated_sequences(tmp_path, database_url):
    """Stateful: the document's links (a created file, webhook or secret leads to its reads,
    updates and deletes) drive sequences of calls on the objects the calls create."""
    from hypothesis.stateful import run_state_machine_as_test

    platform = make_platform(tmp_path, database_url, egress_allow="0.0.0.0/0,::/0")
    app = create_app(platform=platform)
    schema = schemathesis.openapi.from_dict(app.openapi())
    schema.app = app
    document = app.openapi()
    assert document["paths"]["/v1/files"]["post"]["responses"]["200"]["links"]["GetFile"]["parameters"] == {
        "file_id": "$response.body#/id"}
    base = schema.include(path_regex="^/v1/(files|webhooks|secrets)").as_state_machine()
    scenarios = iter(range(10**6))
    calls: list[tuple[str, str, int]] = []

    class Tenant(base):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            # each scenario is a new tenant: what earlier scenarios created (limits reached, names
            # taken) cannot change how this one behaves
            self.auth = {"Authorization": f"Bearer {add_tenant(platform, f'fuzz-{next(scenarios)}')}"}

        def get_call_kwargs(self, case):  # noqa: ANN001, ANN201
            return {"headers": self.auth}

        def validate_response(self, response, case, additional_checks=None, **kwargs):  # noqa: ANN001
            calls.append((case.operation.method.upper(), case.operation.path, response.status_code))
            for check in CHECKS:
                case.validate_response(response, checks=[check], transport_kwargs=kwargs)

    try:
        run_state_machine_as_test(Tenant, settings=settings(
            max_examples=STATEFUL_SCENARIOS, stateful_step_count=STATEFUL_STEPS, derandomize=True, deadline=None,
            database=None, suppress_health_check=list(HealthCheck)))
    finally:
        platform.db.dispose()
    # the links were followed: objects were created and then read, changed or deleted by their ids
    followed = {(method, path) for method, path, status in calls if "{" in path and status < 300}
    assert followed, sorted(set(calls))[:20]
