"""Envelope encryption of tenants' objects (storage/envelope.py) and tenants' data keys
(services/tenancy/data_keys.py)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.security.crypto import Sealer, new_key
from tuneforge.services.tenancy.data_keys import TenantKeyRing
from tuneforge.storage.envelope import CHUNK_BYTES, MAGIC, EncryptingStore, KeyUnavailable, tenant_of


class Keys:
    """Tenant keys in memory; `revoked` tenants' keys are gone."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str], bytes] = {}
        self.revoked: set[str] = set()

    def current(self, tenant_id: str) -> tuple[str, bytes]:
        if tenant_id in self.revoked:
            raise KeyUnavailable("revoked")
        key = self.keys.setdefault((tenant_id, f"k-{tenant_id}"), os.urandom(32))
        return f"k-{tenant_id}", key

    def key(self, tenant_id: str, key_id: str) -> bytes:
        if tenant_id in self.revoked or (tenant_id, key_id) not in self.keys:
            raise KeyUnavailable("revoked")
        return self.keys[(tenant_id, key_id)]


@pytest.fixture
def keys() -> Keys:
    return Keys()


@pytest.fixture
def store(tmp_path: Path, keys: Keys) -> EncryptingStore:
    return EncryptingStore(str(tmp_path / "objects"), keys=keys)


def raw(tmp_path: Path, key: str) -> bytes:
    return (tmp_path / "objects" / key).read_bytes()


def test_tenant_of_names_the_owner_of_tenant_keys_only() -> None:
    assert tenant_of("tenants/t-1/files/f/a.jsonl") == "t-1"
    assert tenant_of("base-models/tiny/abc/config.json") is None
    assert tenant_of("tenants/t-1") is None


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 7])
def test_objects_round_trip_sealed_with_their_plaintext_size(tmp_path: Path, store: EncryptingStore,
                                                             size: int) -> None:
    data = os.urandom(size)
    key = "tenants/t-1/files/f-1/train.jsonl"
    store.put_bytes(key, data)
    stored = raw(tmp_path, key)
    assert stored.startswith(MAGIC) and len(stored) > size
    assert store.get_bytes(key) == data
    assert store.size_bytes(key) == size
    store.get_file(key, tmp_path / "out" / "copy")
    assert (tmp_path / "out" / "copy").read_bytes() == data
    with store.open_read(key) as handle:  # small reads across chunk boundaries
        pieces = []
        while piece := handle.read(4099):
            pieces.append(piece)
    assert b"".join(pieces) == data


def test_the_stored_bytes_do_not_hold_the_plaintext_and_platform_objects_stay_plain(
        tmp_path: Path, store: EncryptingStore) -> None:
    secret = b'{"messages": [{"role": "user", "content": "the launch code is 0000"}]}\n' * 100
    assert store.put_stream("tenants/t-1/files/f-1/train.jsonl", io.BytesIO(secret)) == len(secret)
    assert b"launch code" not in raw(tmp_path, "tenants/t-1/files/f-1/train.jsonl")
    store.put_bytes("base-models/tiny/abc/config.json", b"{}")
    assert raw(tmp_path, "base-models/tiny/abc/config.json") == b"{}"


def test_an_object_written_before_encryption_reads_as_it_is(tmp_path: Path, store: EncryptingStore) -> None:
    path = tmp_path / "objects" / "tenants" / "t-1" / "files" / "old.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"plain old line\n")
    assert store.get_bytes("tenants/t-1/files/old.jsonl") == b"plain old line\n"
    assert store.size_bytes("tenants/t-1/files/old.jsonl") == 15


def test_a_composed_upload_is_its_parts_frames_and_reads_whole(tmp_path: Path, store: EncryptingStore) -> None:
    parts = [os.urandom(CHUNK_BYTES + 5), os.urandom(17), os.urandom(3)]
    keys = []
    for number, part in enumerate(parts):
        keys.append(f"tenants/t-1/uploads/u-1/part-{number}")
        store.put_bytes(keys[-1], part)
    # the parts' sealed bytes, one after another (what a server-side copy of S3 makes)
    joined = b"".join(raw(tmp_path, key) for key in keys)
    (tmp_path / "objects" / "tenants" / "t-1" / "files" / "f-2").mkdir(parents=True)
    (tmp_path / "objects" / "tenants" / "t-1" / "files" / "f-2" / "all.jsonl").write_bytes(joined)
    assert store.get_bytes("tenants/t-1/files/f-2/all.jsonl") == b"".join(parts)
    assert store.size_bytes("tenants/t-1/files/f-2/all.jsonl") == sum(map(len, parts))
    store.compose("tenants/t-1/files/f-3/all.jsonl", [(key, len(part)) for key, part in zip(keys, parts)])
    assert store.get_bytes("tenants/t-1/files/f-3/all.jsonl") == b"".join(parts)


def test_tampering_truncation_and_another_tenants_object_are_refused(tmp_path: Path,
                                                                     store: EncryptingStore) -> None:
    key = "tenants/t-1/jobs/j-1/checkpoints/step-1/adapter.safetensors"
    store.put_bytes(key, os.urandom(2 * CHUNK_BYTES + 10))
    sealed = raw(tmp_path, key)
    path = tmp_path / "objects" / key

    path.write_bytes(sealed[:-40] + bytes([sealed[-40] ^ 1]) + sealed[-39:])  # one bit flipped
    with pytest.raises(KeyUnavailable, match="authenticate"):
        store.get_bytes(key)
    header_end = sealed.index(b"}") + 1
    first_chunk_end = header_end + 4 + CHUNK_BYTES + 16
    path.write_bytes(sealed[:first_chunk_end])  # cut at a chunk boundary: the last-chunk flag is missing
    with pytest.raises(KeyUnavailable, match="truncated"):
        store.get_bytes(key)

    # the same sealed bytes copied under another tenant's prefix are not that tenant's
    other = tmp_path / "objects" / "tenants" / "t-2" / "files" / "stolen"
    other.parent.mkdir(parents=True)
    other.write_bytes(sealed)
    with pytest.raises(KeyUnavailable, match="another tenant"):
        store.get_bytes("tenants/t-2/files/stolen")


def test_a_revoked_tenant_key_makes_its_objects_unreadable_and_refuses_writes(
        store: EncryptingStore, keys: Keys) -> None:
    store.put_bytes("tenants/t-1/files/f-1/a.jsonl", b"one")
    store.put_bytes("tenants/t-2/files/f-1/a.jsonl", b"two")
    keys.revoked.add("t-1")
    with pytest.raises(KeyUnavailable):
        store.get_bytes("tenants/t-1/files/f-1/a.jsonl")
    with pytest.raises(KeyUnavailable):
        store.put_bytes("tenants/t-1/files/f-1/b.jsonl", b"more")
    assert store.get_bytes("tenants/t-2/files/f-1/a.jsonl") == b"two"


def test_the_key_ring_seals_keys_at_rest_and_revocation_erases_them(tmp_path: Path, database_url: str) -> None:
    platform = make_platform(tmp_path, database_url, secrets_key=new_key(), encrypt_tenant_objects=True)
    try:
        add_tenant(platform, "acme")
        store = platform.store
        assert isinstance(store, EncryptingStore)
        ring = store.keys
        assert isinstance(ring, TenantKeyRing)
        store.put_bytes("tenants/t-acme/files/f-1/a.jsonl", b"acme's data")
        key_id, key = ring.current("t-acme")
        from tuneforge.db.repos import secrets as repo

        with platform.db.session() as session:
            row = repo.newest_data_key(session, "t-acme")
            assert row is not None and row.key_id == key_id and row.sealed is not None
            assert row.sealed.startswith("enc:v1:") and key.hex() not in row.sealed
            assert platform.sealer.open(row.sealed)  # opens under the operator's key
        # another process (a fresh ring) opens the object with the key from the database
        fresh = EncryptingStore(store.url, keys=TenantKeyRing(platform.db, platform.sealer))
        assert fresh.get_bytes("tenants/t-acme/files/f-1/a.jsonl") == b"acme's data"

        assert ring.revoke("t-acme") == 1
        for reader in (store, EncryptingStore(store.url, keys=TenantKeyRing(platform.db, platform.sealer))):
            with pytest.raises(KeyUnavailable, match="revoked"):
                reader.get_bytes("tenants/t-acme/files/f-1/a.jsonl")
        with platform.db.session() as session:
            row = repo.newest_data_key(session, "t-acme")
            assert row is not None and row.sealed is None and row.revoked_at is not None
        # under another operator key nothing opens either
        with pytest.raises(Exception):  # noqa: B017, PT011
            Sealer.parse(new_key()).open(platform.sealer.seal("x"))
    finally:
        platform.db.dispose()
