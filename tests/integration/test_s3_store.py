"""FsspecStore against S3 (a moto server): the same behaviour as a local folder."""

from __future__ import annotations

import io
import os

import pytest

from tests.helpers.s3 import S3Storage
from tests.helpers.store_contract import PAYLOAD, StoreContract
from tuneforge.settings import Settings
from tuneforge.storage import FsspecStore, open_store

pytestmark = pytest.mark.s3


@pytest.fixture
def store(s3_storage: S3Storage) -> FsspecStore:
    return open_store(s3_storage.url, s3_storage.options)


class TestS3Store(StoreContract):
    pass


def test_objects_land_under_the_bucket_prefix(s3_storage: S3Storage, store: FsspecStore) -> None:
    store.put_bytes("tenants/t1/files/f/train.jsonl", PAYLOAD)
    listed = s3_storage.client().list_objects_v2(Bucket=s3_storage.bucket)
    assert [obj["Key"] for obj in listed["Contents"]] == [
        f"{s3_storage.prefix}/tenants/t1/files/f/train.jsonl"
    ]
    assert listed["Contents"][0]["Size"] == len(PAYLOAD)


def test_settings_from_env_open_the_same_bucket(
    s3_storage: S3Storage, store: FsspecStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_storage.env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.resolved_storage_url == s3_storage.url
    assert settings.storage_options() == s3_storage.options

    from_settings = open_store(settings.resolved_storage_url, settings.storage_options())
    from_settings.put_bytes("k", b"via settings")
    assert store.get_bytes("k") == b"via settings"


def test_objects_written_by_another_process_are_seen(s3_storage: S3Storage, store: FsspecStore) -> None:
    """A trainer writes checkpoints with its own client; the control plane must see
    them even after it has listed (and so could have cached) the same prefix."""
    prefix = "tenants/t1/jobs/j/checkpoints"
    store.put_bytes(f"{prefix}/step-1/manifest.json", b"{}")
    assert store.list(prefix) == [f"{prefix}/step-1/manifest.json"]
    assert not store.exists(f"{prefix}/step-2/manifest.json")

    other = s3_storage.client()
    other.put_object(Bucket=s3_storage.bucket, Key=f"{s3_storage.prefix}/{prefix}/step-2/manifest.json", Body=b"{}")
    other.put_object(Bucket=s3_storage.bucket, Key=f"{s3_storage.prefix}/{prefix}/step-1/extra", Body=b"123")

    assert store.exists(f"{prefix}/step-2/manifest.json")
    assert store.list(prefix) == [
        f"{prefix}/step-1/extra",
        f"{prefix}/step-1/manifest.json",
        f"{prefix}/step-2/manifest.json",
    ]
    assert store.size_bytes(f"{prefix}/step-1/extra") == 3

    other.delete_object(Bucket=s3_storage.bucket, Key=f"{s3_storage.prefix}/{prefix}/step-1/extra")
    assert not store.exists(f"{prefix}/step-1/extra")


def test_buckets_are_fresh_per_test(s3_storage: S3Storage, store: FsspecStore) -> None:
    assert store.list("tenants") == []
    assert s3_storage.client().list_objects_v2(Bucket=s3_storage.bucket)["KeyCount"] == 0


@pytest.mark.parametrize("sse", ["AES256", "aws:kms"])
def test_objects_are_written_with_server_side_encryption_when_configured(
    s3_storage: S3Storage, monkeypatch: pytest.MonkeyPatch, sse: str
) -> None:
    for name, value in s3_storage.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TUNEFORGE_S3_SSE", sse)
    if sse == "aws:kms":
        monkeypatch.setenv("TUNEFORGE_S3_SSE_KMS_KEY_ID", "alias/tuneforge")
    settings = Settings()
    store = open_store(settings.resolved_storage_url, settings.storage_options())
    store.put_bytes("sealed/small", b"payload")
    store.put_stream("sealed/stream", io.BytesIO(b"x" * 1024))
    for key in ("sealed/small", "sealed/stream"):
        head = s3_storage.client().head_object(Bucket=s3_storage.bucket, Key=f"{s3_storage.prefix}/{key}")
        assert head["ServerSideEncryption"] == sse
        if sse == "aws:kms":
            assert head["SSEKMSKeyId"].endswith("alias/tuneforge")
    # trainers given the store itself (not the object proxy) get the same setting through their
    # allow-listed environment; behind the proxy they get no store setting at all
    assert "TUNEFORGE_S3_SSE" not in settings.trainer_env()
    assert Settings(trainer_storage="direct").trainer_env()["TUNEFORGE_S3_SSE"] == sse


def test_an_unknown_server_side_encryption_is_refused() -> None:
    with pytest.raises(ValueError, match="AES256"):
        Settings(s3_sse="rot13")


def test_compose_of_parts_of_5_mib_and_more_stays_inside_s3(store: FsspecStore, monkeypatch) -> None:
    parts = [os.urandom(5 * 1024 * 1024), os.urandom(5 * 1024 * 1024 + 1), b"tail"]
    for index, data in enumerate(parts):
        store.put_bytes(f"u/{index}", data)
    streamed = []
    monkeypatch.setattr(store, "put_stream", lambda *args: streamed.append(args))  # no bytes through here
    how = store.compose("files/whole", [("u/1", len(parts[1])), ("u/0", len(parts[0])), ("u/2", len(parts[2]))])
    assert how == "server-side" and streamed == []
    assert store.get_bytes("files/whole") == parts[1] + parts[0] + parts[2]
    assert store.size_bytes("files/whole") == sum(map(len, parts))
