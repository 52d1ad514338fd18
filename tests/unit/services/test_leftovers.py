"""The leftover sweep: file objects without a row go after the grace period; files
with a row, and orphans still within their grace, stay."""

from __future__ import annotations

import io
from pathlib import Path

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.services.datasets import files as file_service
from tuneforge.services.datasets.leftovers import LeftoverSweeper, stored_file_ids
from tuneforge.storage import layout

GRACE_S = 3600.0


def _platform(tmp_path: Path):  # noqa: ANN202
    platform = make_platform(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    add_tenant(platform, "acme")
    with platform.db.session() as session:
        tenant_id = tenant_repo.by_name(session, "acme").tenant_id
    return platform, tenant_id


def _orphan(platform, tenant_id: str, file_id: str) -> None:  # noqa: ANN001
    """What a worker killed between writing and committing leaves: bytes and a report, no row."""
    platform.store.put_bytes(layout.file_key(tenant_id, file_id, "train.jsonl"), b'{"text": "x"}\n')
    platform.store.put_bytes(layout.file_report_key(tenant_id, file_id), b"{}")


def test_orphans_go_after_the_grace_and_owned_files_stay(tmp_path: Path) -> None:
    platform, tenant_id = _platform(tmp_path)
    with platform.db.session() as session:
        kept = file_service.upload(session, platform.store, tenant_id, filename="notes.txt", purpose="assistants",
                                   stream=io.BytesIO(b"hello"), max_bytes=1024)
    _orphan(platform, tenant_id, "file-orphan1")
    sweeper = LeftoverSweeper(grace_s=GRACE_S)
    with platform.db.session() as session:
        assert sweeper.sweep(session, platform.store, now=1000.0) == 0  # first seen: its grace starts
        assert sweeper.sweep(session, platform.store, now=1000.0 + GRACE_S - 1) == 0
        assert stored_file_ids(platform.store, tenant_id) == {kept.file_id, "file-orphan1"}
        assert sweeper.sweep(session, platform.store, now=1000.0 + GRACE_S) == 1
    assert stored_file_ids(platform.store, tenant_id) == {kept.file_id}
    assert not platform.store.exists(layout.file_report_key(tenant_id, "file-orphan1"))
    assert platform.store.exists(kept.key)


def test_an_orphan_that_gets_its_row_is_forgotten(tmp_path: Path) -> None:
    platform, tenant_id = _platform(tmp_path)
    sweeper = LeftoverSweeper(grace_s=GRACE_S)
    with platform.db.session() as session:
        row = file_service.upload(session, platform.store, tenant_id, filename="a.txt", purpose="assistants",
                                  stream=io.BytesIO(b"a"), max_bytes=1024)
        file_id = row.file_id
        session.rollback()  # the commit never happened: the bytes are there, the row is not
    with platform.db.session() as session:
        assert sweeper.sweep(session, platform.store, now=0.0) == 0
    assert stored_file_ids(platform.store, tenant_id) == {file_id}
    with platform.db.session() as session:  # a late sweep never deletes what a row owns
        file_service.register(session, platform.store, tenant_id, file_id=file_id,
                              key=layout.file_key(tenant_id, file_id, "a.txt"), filename="a.txt",
                              purpose="assistants", size_bytes=1, sha256="0" * 64, tier="standard",
                              expires_after_s=None)
    with platform.db.session() as session:
        assert sweeper.sweep(session, platform.store, now=10 * GRACE_S) == 0
    assert stored_file_ids(platform.store, tenant_id) == {file_id}


def test_a_report_alone_is_a_leftover_too(tmp_path: Path) -> None:
    platform, tenant_id = _platform(tmp_path)
    platform.store.put_bytes(layout.file_report_key(tenant_id, "file-lonely"), b"{}")
    sweeper = LeftoverSweeper(grace_s=0.0)
    with platform.db.session() as session:
        assert sweeper.sweep(session, platform.store, now=5.0) == 1
    assert stored_file_ids(platform.store, tenant_id) == set()
