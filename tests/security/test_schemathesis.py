"""Property-based fuzzing of every tenant operation in the OpenAPI document, in process, on a fixed
budget: valid and invalid inputs derived from the schema never answer 5xx, and every answer has a
documented status code, content type and (for JSON) shape.

The schema is `app.openapi()` (not GET /openapi.json, which an operator may close). The admin API
is left out (off without a key; covered by tests/unit/api/test_admin.py); trainer reports are not
in the document. No base model is registered, so a job body that validates still answers 400
(unknown model) and nothing trains.
"""

from __future__ import annotations

import time

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

EXAMPLES_PER_OPERATION = 25  # about 45 s for the whole run on two shared CPUs
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
    started = time.monotonic()
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
    assert time.monotonic() - started < 120

