"""`evals` files are checked at upload (400 naming the line; a bounded count and size), and one
stored before these checks never makes the tenant's later uploads fail (services/training/eval_sets.py)."""

from __future__ import annotations

import io
import json

import pytest
from fastapi.testclient import TestClient

from tests.helpers.files import processed_over_http
from tests.helpers.platform import add_tenant, chat_lines, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import FileRow
from tuneforge.services.training import eval_sets
from tuneforge.storage import layout

GOOD = (json.dumps({"prompt": "2+2=", "completion": "4"}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
        + "\n").encode()


@pytest.fixture
def world(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    key = add_tenant(platform, "grader")
    yield platform, http, {"Authorization": f"Bearer {key}"}
    http.close()
    platform.db.dispose()


def _upload(http: TestClient, headers: dict, data: bytes, purpose: str = "evals"):
    return http.post("/v1/files", headers=headers, data={"purpose": purpose},
                     files={"file": ("set.jsonl", io.BytesIO(data))})


def test_a_well_formed_evals_file_is_accepted(world):
    _platform, http, headers = world
    answer = _upload(http, headers, GOOD)
    assert answer.status_code == 200 and answer.json()["status"] == "processed"


@pytest.mark.parametrize("data, line, code", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", 1, "invalid_encoding"),  # a binary file
    (GOOD + b"{not json\n", 3, "invalid_json"),
    (GOOD + b"[1, 2]\n", 3, "invalid_example"),
    (GOOD + json.dumps({"prompt": "only a prompt"}).encode() + b"\n", 3, "invalid_example"),
    (GOOD + json.dumps({"messages": [{"role": "user", "content": "no answer"}]}).encode() + b"\n", 3,
     "invalid_example"),
])
def test_a_bad_evals_file_is_a_400_naming_the_line_and_leaves_nothing(world, data, line, code):
    platform, http, headers = world
    answer = _upload(http, headers, data)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and error["param"] == "file" and error["message"].startswith(f"line {line}:")
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "grader").tenant_id
    assert platform.store.list(f"{layout.tenant_prefix(tenant_id)}/files") == []


def test_an_empty_or_oversized_evals_file_is_refused(world, monkeypatch):
    _platform, http, headers = world
    assert _upload(http, headers, b"\n\n").json()["error"]["code"] == "empty_file"
    monkeypatch.setattr(eval_sets, "MAX_EVALS_FILE_BYTES", len(GOOD) - 1)
    assert _upload(http, headers, GOOD).status_code == 413


def test_a_tenant_keeps_a_bounded_number_of_evals_files(world, monkeypatch):
    _platform, http, headers = world
    monkeypatch.setattr(eval_sets, "MAX_TENANT_EVAL_FILES", 2)
    assert [_upload(http, headers, GOOD).status_code for _ in range(3)] == [200, 200, 400]
    assert _upload(http, headers, GOOD).json()["error"]["code"] == "too_many_eval_files"


def test_evals_stored_before_the_checks_never_break_later_uploads(world):
    """A binary evals file and more files than the index holds, written straight to the database
    as an older version could have: a fine-tune upload is still checked and accepted."""
    platform, http, headers = world
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "grader").tenant_id
        for number in range(eval_sets.MAX_SOURCES + 6):
            key = layout.file_key(tenant_id, f"file-old{number}", "set.jsonl")
            platform.store.put_bytes(key, b"\x00\xff" * 64 if number % 2 else GOOD)
            session.add(FileRow(file_id=f"file-old{number}", tenant_id=tenant_id, filename="set.jsonl",
                                purpose="evals", size_bytes=128, key=key, sha256=f"{number:064d}",
                                status="processed", created_at=0))
    answer = _upload(http, headers, chat_lines(20), purpose="fine-tune")
    assert answer.status_code == 200, answer.text
    assert processed_over_http(http, headers, answer.json())["status"] == "processed"
    with platform.db.session() as session:
        index = eval_sets.index_for(session, platform.store, tenant_id)
    assert index is not None and len(index.sources) <= eval_sets.MAX_SOURCES
