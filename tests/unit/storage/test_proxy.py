"""ProxyStore's client side (storage/proxy.py): URLs, answers mapped to exceptions, and tries again
while the control plane is away."""

from __future__ import annotations

import io

import httpx
import pytest

from tuneforge.storage import proxy
from tuneforge.storage.proxy import ObjectAccessError, ProxyStore, is_proxy_url, proxy_url

URL = proxy_url("http://plane:8000/", "ftjob-1")


def _store(handler, monkeypatch) -> ProxyStore:
    monkeypatch.setattr(proxy, "_RETRY_PAUSE_S", 0.001)
    return ProxyStore(URL, "tok", client=httpx.Client(transport=httpx.MockTransport(handler)))


def test_the_url_names_the_plane_and_the_job():
    assert URL == "tuneforge+http://plane:8000/internal/v1/jobs/ftjob-1/objects" and is_proxy_url(URL)
    assert not is_proxy_url("s3://bucket/prefix") and not is_proxy_url("/srv/objects")


def test_answers_become_the_store_s_exceptions(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer tok"
        if request.url.path.endswith("/missing"):
            return httpx.Response(404)
        return httpx.Response(403, json={"error": {"message": "no", "code": "object_out_of_scope"}})

    store = _store(handler, monkeypatch)
    with pytest.raises(FileNotFoundError):
        store.get_bytes("tenants/t/jobs/ftjob-1/missing")
    assert not store.exists("tenants/t/jobs/ftjob-1/missing")
    with pytest.raises(ObjectAccessError) as refused:
        store.get_bytes("tenants/other/files/x")
    assert refused.value.status_code == 403 and refused.value.code == "object_out_of_scope"
    with pytest.raises(ValueError):
        store.get_bytes("tenants/../x")


def test_a_busy_or_restarting_plane_is_asked_again(monkeypatch, tmp_path):
    bodies: list[bytes] = []
    answers = iter([503, 503, 201, 503, 201])

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(request.read())
        return httpx.Response(next(answers), json={})

    store = _store(handler, monkeypatch)
    path = tmp_path / "weights.bin"
    path.write_bytes(b"w" * 10_000)
    store.put_file("tenants/t/jobs/ftjob-1/weights.bin", path)
    assert bodies == [b"w" * 10_000] * 3  # each try sends the whole file again
    with pytest.raises(OSError, match="503"):  # a stream cannot be sent twice
        store.put_stream("tenants/t/jobs/ftjob-1/s", io.BytesIO(b"abc"))
