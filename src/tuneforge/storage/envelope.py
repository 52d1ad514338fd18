"""Envelope encryption of tenants' objects: each object under `tenants/{id}/` is sealed with its
own random data key (AES-256-GCM), and that data key is stored with the object wrapped by the
tenant's key. The tenant's key is held by the control plane only, itself sealed under the
operator's key (`services/tenancy/data_keys.py`); a trainer never sees one (it reads through the
control plane's storage proxy). Revoking a tenant's key makes every object sealed under it
unreadable, wherever its bytes were copied.

An object is one or more frames (a composed upload is its parts' frames one after another):

    b"TFE1" | u16 header length | header (JSON: v, tenant, key id, wrapped data key, nonce prefix)
    then chunks: u32 (plaintext length | LAST bit) | AES-GCM(chunk) (length + 16 bytes)

Chunk `i` is sealed with nonce = prefix (8 bytes) + i (4 bytes) and the header, `i` and its
last-chunk flag as associated data, so chunks cannot be reordered, dropped, truncated at a chunk
boundary or moved between objects' headers without the read failing. An object that does not start
with the magic (written before encryption was turned on, or outside `tenants/`) reads as it is.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
from pathlib import Path
from typing import IO, Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tuneforge.storage.store import FsspecStore

MAGIC = b"TFE1"
CHUNK_BYTES = 1 << 20
_LAST = 0x8000_0000
_MAX_HEADER = 4096
_TAG = 16


class KeyUnavailable(Exception):
    """The tenant's key is revoked or unknown: its objects cannot be read (or written)."""


class TenantKeys(Protocol):
    def current(self, tenant_id: str) -> tuple[str, bytes]:
        """(key id, 32-byte key) new objects of the tenant are sealed under."""
        ...

    def key(self, tenant_id: str, key_id: str) -> bytes:
        """The tenant's key `key_id`; raises KeyUnavailable once revoked."""
        ...


def tenant_of(key: str) -> str | None:
    """The tenant whose object `key` is (`layout.tenant_prefix`), None for the platform's own."""
    parts = key.strip("/").split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tenants" and parts[1] else None


def _wrap_aad(tenant_id: str, key_id: str) -> bytes:
    return f"tuneforge-data-key|{tenant_id}|{key_id}".encode()


def _chunk_aad(header: bytes, index: int, last: bool) -> bytes:
    return header + struct.pack(">I?", index, last)


class _Sealing(io.RawIOBase):
    """A readable stream of the sealed frame of `source` (pull-based, one chunk in memory)."""

    def __init__(self, source: IO[bytes], tenant_id: str, keys: TenantKeys) -> None:
        super().__init__()
        key_id, tenant_key = keys.current(tenant_id)
        data_key = AESGCM.generate_key(bit_length=256)
        wrap_nonce = os.urandom(12)
        wrapped = wrap_nonce + AESGCM(tenant_key).encrypt(wrap_nonce, data_key, _wrap_aad(tenant_id, key_id))
        self._prefix = os.urandom(8)
        self._header = json.dumps({"v": 1, "tenant": tenant_id, "key": key_id,
                                   "wrapped": base64.b64encode(wrapped).decode(),
                                   "nonce": base64.b64encode(self._prefix).decode()}, sort_keys=True).encode()
        self._aead = AESGCM(data_key)
        self._source = source
        self._pending = MAGIC + struct.pack(">H", len(self._header)) + self._header
        self._index = 0
        self._next = _read_full(source, CHUNK_BYTES)
        self._done = False
        self.plaintext_bytes = 0

    def readable(self) -> bool:
        return True

    def _seal_next(self) -> None:
        chunk = self._next
        self._next = _read_full(self._source, CHUNK_BYTES) if len(chunk) == CHUNK_BYTES else b""
        last = not self._next
        nonce = self._prefix + struct.pack(">I", self._index)
        sealed = self._aead.encrypt(nonce, chunk, _chunk_aad(self._header, self._index, last))
        self._pending += struct.pack(">I", len(chunk) | (_LAST if last else 0)) + sealed
        self._index += 1
        self.plaintext_bytes += len(chunk)
        self._done = last

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._done:
            self._seal_next()
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _read_full(stream: IO[bytes], size: int) -> bytes:
    parts, left = [], size
    while left > 0:
        part = stream.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


class _Opening(io.RawIOBase):
    """The plaintext of a sealed object's frames (or of a plain object, as it is)."""

    def __init__(self, raw: IO[bytes], keys: TenantKeys, object_key: str) -> None:
        super().__init__()
        self._raw, self._keys, self._object_key = raw, keys, object_key
        first = _read_full(raw, len(MAGIC))
        self._plain = first != MAGIC
        self._pending = first if self._plain else b""
        self._frame: tuple[bytes, AESGCM, bytes] | None = None
        self._index = 0
        self._eof = False
        if not self._plain:
            self._open_frame()

    def readable(self) -> bool:
        return True

    def _fail(self, why: str) -> KeyUnavailable:
        return KeyUnavailable(f"object {self._object_key!r} cannot be opened: {why}")

    def _open_frame(self) -> None:
        (length,) = struct.unpack(">H", _read_full(self._raw, 2).rjust(2, b"\0"))
        if not 0 < length <= _MAX_HEADER:
            raise self._fail("its header is damaged")
        header = _read_full(self._raw, length)
        try:
            fields = json.loads(header)
            wrapped = base64.b64decode(fields["wrapped"])
            tenant_id, key_id, prefix = fields["tenant"], fields["key"], base64.b64decode(fields["nonce"])
        except (ValueError, KeyError, TypeError) as exc:
            raise self._fail("its header is damaged") from exc
        if tenant_of(self._object_key) not in (None, tenant_id):
            raise self._fail("it was sealed for another tenant")
        tenant_key = self._keys.key(tenant_id, key_id)
        try:
            data_key = AESGCM(tenant_key).decrypt(wrapped[:12], wrapped[12:], _wrap_aad(tenant_id, key_id))
        except InvalidTag as exc:
            raise self._fail("its data key does not open under the tenant's key") from exc
        self._frame = (header, AESGCM(data_key), prefix)
        self._index = 0

    def _open_chunk(self) -> None:
        assert self._frame is not None
        header, aead, prefix = self._frame
        word = _read_full(self._raw, 4)
        if len(word) < 4:
            raise self._fail("it is truncated")
        (value,) = struct.unpack(">I", word)
        last, length = bool(value & _LAST), value & ~_LAST
        if length > CHUNK_BYTES:
            raise self._fail("a chunk is damaged")
        sealed = _read_full(self._raw, length + _TAG)
        try:
            self._pending = aead.decrypt(prefix + struct.pack(">I", self._index),
                                         sealed, _chunk_aad(header, self._index, last))
        except InvalidTag as exc:
            raise self._fail("a chunk does not authenticate (damaged or truncated)") from exc
        self._index += 1
        if last:  # another frame follows in a composed object, or the end
            magic = _read_full(self._raw, len(MAGIC))
            if not magic:
                self._eof = True
            elif magic != MAGIC:
                raise self._fail("bytes follow its last frame")
            else:
                self._open_frame()

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            if self._plain:
                self._pending = self._raw.read(len(buffer))
                if not self._pending:
                    return 0
            elif self._eof:
                return 0
            else:
                self._open_chunk()
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


class EncryptingStore(FsspecStore):
    """An object store that seals every object under `tenants/{id}/` with envelope encryption
    and opens sealed objects on read; the platform's own objects (base models, eval sets) stay
    plain. Listing, deleting and composing work on the sealed bytes as they are."""

    def __init__(self, url: str, storage_options: dict | None = None, *, keys: TenantKeys) -> None:
        super().__init__(url, storage_options)
        self.keys = keys

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_stream(key, io.BytesIO(data))

    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        tenant_id = tenant_of(key)
        if tenant_id is None:
            return super().put_stream(key, stream)
        sealing = _Sealing(stream, tenant_id, self.keys)
        super().put_stream(key, io.BufferedReader(sealing, CHUNK_BYTES))
        return sealing.plaintext_bytes

    def open_read(self, key: str) -> IO[bytes]:
        return io.BufferedReader(_Opening(super().open_read(key), self.keys, key), CHUNK_BYTES)

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as handle:
            return handle.read()

    def get_file(self, key: str, local_path: Path) -> None:
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.with_name(local_path.name + ".part")
        with self.open_read(key) as source, open(tmp, "wb") as target:
            while chunk := source.read(CHUNK_BYTES):
                target.write(chunk)
        tmp.replace(local_path)

    def size_bytes(self, key: str) -> int:
        """The plaintext size (a sealed object's chunk lengths added up, reading only their
        headers); a plain object's size as stored."""
        stored = super().size_bytes(key)
        with super().open_read(key) as raw:
            if _read_full(raw, len(MAGIC)) != MAGIC:
                return stored
            return _sealed_plaintext_size(raw, stored)


def _sealed_plaintext_size(raw: IO[bytes], stored: int) -> int:
    total, position = 0, len(MAGIC)
    while position < stored:
        raw.seek(position)
        (length,) = struct.unpack(">H", _read_full(raw, 2))
        position += 2 + length
        while True:
            raw.seek(position)
            (value,) = struct.unpack(">I", _read_full(raw, 4))
            total += value & ~_LAST
            position += 4 + (value & ~_LAST) + _TAG
            if value & _LAST:
                break
        position += len(MAGIC)
    return total

