"""Ranges and the upload pipe of the object proxy (api/object_io.py)."""

from __future__ import annotations

import asyncio
import io

import pytest

from tuneforge.api.object_io import parse_range, read_chunks, receive_into
from tuneforge.domain.errors import ApiError
from tuneforge.scheduler.spec_builder import trainer_storage_url
from tuneforge.settings import Settings


def test_ranges_as_http_reads_them():
    assert parse_range(None, 100) is None
    assert parse_range("bytes=0-9", 100) == (0, 9)
    assert parse_range("bytes=90-", 100) == (90, 99)
    assert parse_range("bytes=-10", 100) == (90, 99)
    assert parse_range("bytes=50-1000", 100) == (50, 99)  # clipped to the object
    assert parse_range("bytes=-1000", 100) == (0, 99)
    assert parse_range("bytes=0-1,5-6", 100) is None  # several ranges: the whole object
    assert parse_range("items=0-1", 100) is None
    for bad in ("bytes=100-", "bytes=9-3", "bytes=x-y", "bytes=-0", "bytes=5"):
        with pytest.raises(ApiError) as refused:
            parse_range(bad, 100)
        assert refused.value.status_code == 416


class _Store:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put_stream(self, key, stream):
        data = b""
        while chunk := stream.read(7):
            data += chunk
        self.objects[key] = data
        return len(data)

    def delete(self, key):
        self.objects.pop(key, None)

    def open_read(self, key):
        return io.BytesIO(self.objects[key])


async def _chunks(parts):
    for part in parts:
        yield part


def test_an_upload_streams_through_and_one_past_its_bound_leaves_nothing():
    store = _Store()
    parts = [bytes([i]) * 1000 for i in range(50)]  # more chunks than the pipe holds
    assert asyncio.run(receive_into(store, "k", _chunks(parts), 50_000)) == 50_000
    assert store.objects["k"] == b"".join(parts)
    assert b"".join(read_chunks(store, "k", 1500, 1000)) == store.objects["k"][1500:2500]
    with pytest.raises(ApiError) as refused:
        asyncio.run(receive_into(store, "big", _chunks(parts), 49_999))
    assert refused.value.status_code == 413 and "big" not in store.objects


def test_trainers_get_the_proxy_unless_the_operator_hands_them_the_store(tmp_path):
    proxied = Settings(home=tmp_path, public_url="http://plane:8000", storage_url="s3://bucket/p")
    assert trainer_storage_url(proxied, "ftjob-1") == "tuneforge+http://plane:8000/internal/v1/jobs/ftjob-1/objects"
    direct = Settings(home=tmp_path, storage_url="s3://bucket/p", trainer_storage="direct")
    assert trainer_storage_url(direct, "ftjob-1") == "s3://bucket/p"
