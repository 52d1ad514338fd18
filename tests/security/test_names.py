"""No field a tenant fills names a path or an environment variable of the platform: path-like
and variable-like values in every name or id field are taken literally — a 4xx naming the
field, or stored as plain text — and no planted value of the environment shows up."""

from __future__ import annotations

import io

import pytest
from sqlalchemy import select

from tests.unit.api.conftest import world  # noqa: F401 - the fixture
from tuneforge.db.tables import FileRow

PLANTED = "planted-0d9a6f21"
HOSTILE = ["/etc/passwd", "../../../../etc/passwd", "$TUNEFORGE_ADMIN_API_KEY", "${TUNEFORGE_DATABASE_URL}",
           "%TUNEFORGE_ADMIN_API_KEY%", "~/.aws/credentials", "file:///etc/passwd", "s3://other-bucket/x"]


@pytest.fixture(autouse=True)
def planted(monkeypatch):
    monkeypatch.setenv("TUNEFORGE_ADMIN_API_KEY", PLANTED)
    monkeypatch.setenv("TUNEFORGE_DATABASE_URL", f"postgresql://u:{PLANTED}@db/x")


# one platform per test, every hostile value in a loop: a platform per value costs a database each


@pytest.mark.parametrize("field", ["model", "training_file", "validation_file", "suffix"])
def test_job_fields_are_names_not_paths_or_variables(world, field):  # noqa: F811
    for value in HOSTILE:
        body = {"model": world.base_model, "training_file": "file-none", field: value}
        answer = world.http.post("/v1/fine_tuning/jobs", json=body, headers=world.headers(world.key_a))
        assert 400 <= answer.status_code < 500, (value, answer.text)
        assert answer.json()["error"]["param"] in (field, "training_file"), (value, answer.text)
        assert PLANTED not in answer.text and "root:" not in answer.text, value


def test_eval_task_file_and_metadata_are_plain_values(world):  # noqa: F811
    for value in HOSTILE:
        body = {"model": world.base_model, "training_file": "file-none", "metadata": {"k": value},
                "eval": {"task_file": value}}
        answer = world.http.post("/v1/fine_tuning/jobs", json=body, headers=world.headers(world.key_a))
        assert answer.status_code == 400 and PLANTED not in answer.text, (value, answer.text)


def test_an_uploaded_filename_is_only_a_name(world):  # noqa: F811
    for value in HOSTILE:
        _upload_named(world, value)


def _upload_named(world, value: str) -> None:  # noqa: F811
    data = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
    answer = world.http.post("/v1/files", files={"file": (value, io.BytesIO(data))}, data={"purpose": "fine-tune"},
                             headers=world.headers(world.key_a))
    assert answer.status_code in (200, 400), (value, answer.text)
    assert PLANTED not in answer.text
    if answer.status_code == 200:
        file_id = answer.json()["id"]
        content = world.http.get(f"/v1/files/{file_id}/content", headers=world.headers(world.key_a))
        assert content.content == data  # the tenant's own bytes, never a file of the host
        with world.platform.db.session() as session:
            row = session.scalar(select(FileRow).where(FileRow.file_id == file_id))
        # stored under the tenant's own prefix, whatever the name says
        assert row.key.startswith("tenants/") and ".." not in row.key.split("/"), row.key


def test_path_parameters_are_ids_not_paths(world):  # noqa: F811
    paths = ([f"/v1/files/{v}" for v in ("..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd")]
             + [f"/v1/models/{v}" for v in ("..%2F..%2Fetc%2Fpasswd", "%24TUNEFORGE_ADMIN_API_KEY")]
             + ["/v1/fine_tuning/jobs/..%2F..%2Fetc%2Fpasswd/download"])
    for path in paths:
        answer = world.http.get(path, headers=world.headers(world.key_a))
        assert answer.status_code in (400, 404), (path, answer.text)
        assert PLANTED not in answer.text and "root:" not in answer.text, path
