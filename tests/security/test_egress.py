"""The egress policy (security/egress.py): what a tenant-supplied URL may point at, checked
when it is given (through the real webhook API) and again when the platform connects.

No real network: host names resolve through resolvers the tests inject, and the only
address ever contacted is 127.0.0.1, where the tests start their own listeners."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.api.app import create_app
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job, WebhookDelivery
from tuneforge.domain.errors import ApiError
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.status import JobStatus
from tuneforge.security.egress import EgressDenied, EgressPolicy
from tuneforge.security.tls import verified_context
from tuneforge.services.context import Platform
from tuneforge.services.training.transitions import transition
from tuneforge.services.webhooks.delivery import Dispatcher

PUBLIC_V4 = "93.184.216.34"
PUBLIC_V6 = "2606:2800:220:1:248:1893:25c8:1946"
NAMES = {
    "hooks.public.test": [PUBLIC_V4, PUBLIC_V6],
    "internal.corp.test": ["10.20.30.40"],
    "metadata.corp.test": ["169.254.169.254"],
    "mixed.corp.test": [PUBLIC_V4, "192.168.7.7"],
    "six.corp.test": ["::ffff:10.9.9.9"],
    "hooks.internal": ["10.1.2.3"],
    "other.hooks.internal": ["10.1.2.4"],
    "loop.test": ["127.0.0.1"],
}


def resolve(host: str) -> list[str]:
    """A fixed DNS: NAMES, and nothing else resolves."""
    if host in NAMES:
        return list(NAMES[host])
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


# ---- the API ------------------------------------------------------------------------

@dataclass
class Api:
    platform: Platform
    http: TestClient
    key: str
    other_key: str

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def allow(self, text: str) -> None:
        """Set TUNEFORGE_EGRESS_ALLOW for the requests that follow."""
        self.platform.settings = self.platform.settings.model_copy(update={"egress_allow": text})

    def create(self, url: str) -> httpx.Response:
        return self.http.post("/v1/webhooks", json={"url": url}, headers=self.headers())


@pytest.fixture
def api(tmp_path, database_url):
    platform = make_platform(tmp_path, database_url, webhook_timeout_s=5.0, webhook_max_attempts=3)
    http = TestClient(create_app(platform=platform), raise_server_exceptions=False)
    http.app.state.egress_resolver = resolve
    yield Api(platform, http, add_tenant(platform, "alpha"), add_tenant(platform, "beta"))
    http.close()
    platform.db.dispose()


FORBIDDEN = [
    # loopback, every spelling the C resolver reads
    "http://127.0.0.1/hook",
    "http://127.0.0.1:8080/hook",
    "http://127.9.9.9/",
    "http://2130706433/",
    "http://0177.0.0.1/",
    "http://0x7f.0.0.1/",
    "http://0x7F000001/",
    "http://017700000001/",
    "http://127.1/",
    "http://127.0.1/",
    "http://127.0.0.1./",
    "http://[::1]/",
    "http://[0:0:0:0:0:0:0:1]:8080/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::7f00:1]/",  # IPv4-compatible
    "http://[64:ff9b::7f00:1]/",  # NAT64
    "http://[2002:7f00:1::1]/",  # 6to4
    "http://localhost/",
    "http://LocalHost./hook",
    "http://api.localhost/",
    "http://%31%32%37.0.0.1/",
    "http://%6c%6f%63%61%6c%68%6f%73%74/",
    # private
    "http://10.0.0.5/",
    "https://172.16.0.1/",
    "http://192.168.1.1:8443/",
    "http://0xa000005/",
    "http://100.64.0.1/",  # carrier-grade NAT
    "http://[fc00::1]/",
    "http://[fd12:3456:789a::1]/",
    "http://[::ffff:10.0.0.5]/",
    "http://[64:ff9b::10.0.0.5]/",
    "http://[2002:c0a8:101::1]/",
    # link-local and the cloud metadata address
    "http://169.254.169.254/latest/meta-data/",
    "http://2852039166/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[fe80::1]/",
    "http://[fe80::1%25eth0]/",
    # multicast, unspecified, broadcast, reserved
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://0.0.0.0/",
    "http://0/",
    "http://[::]/",
    "http://255.255.255.255/",
    "http://240.0.0.1/",
    # names that resolve to such addresses
    "https://internal.corp.test/hook",
    "https://metadata.corp.test/",
    "https://mixed.corp.test/",
    "https://six.corp.test/",
    "https://hooks.internal/",
    "http://loop.test:8080/",
    # credentials in the URL
    "https://user:secret@hooks.public.test/hook",
    "https://token@hooks.public.test/hook",
]


def test_every_forbidden_address_is_refused_at_input_naming_the_field(api):
    answers = {}
    for url in FORBIDDEN:  # one platform for all of them: each check is a request, not a setup
        response = api.create(url)
        error = response.json().get("error") or {}
        answers[url] = (response.status_code, error.get("type"), error.get("param"), error.get("code"))
    wrong = {url: answer for url, answer in answers.items()
             if answer != (400, "invalid_request_error", "url", "url_not_allowed")}
    assert wrong == {}
    assert api.http.get("/v1/webhooks", headers=api.headers()).json()["data"] == []


def test_the_message_says_why_and_never_names_an_address_the_tenant_did_not_give(api):
    error = api.create("http://10.0.0.5/hook").json()["error"]
    assert "private address (10.0.0.5)" in error["message"] and "TUNEFORGE_EGRESS_ALLOW" in error["message"]
    assert "link-local address (169.254.169.254)" in api.create("http://169.254.169.254/").json()["error"]["message"]
    assert "loopback address (2130706433)" in api.create("http://2130706433/").json()["error"]["message"]
    by_name = api.create("https://internal.corp.test/hook").json()["error"]["message"]
    assert "internal.corp.test resolves to a private address" in by_name
    assert "10.20.30.40" not in by_name  # what our resolver answered stays ours


MALFORMED = [
    "ftp://hooks.public.test/x", "hooks.public.test/x", "https://", "http://hooks.public.test:99999/",
    "http://hooks.public.test:0/", "https://hooks.public.test/" + "x" * 2100, "http://hooks public.test/",
    "http://1.2.3.4.5/", "http://256.1.1.1/", "http://08.0.0.1/", "http://[::1/", "http://evil.test\\@10.0.0.1/",
]


def test_a_malformed_url_is_refused_as_invalid(api):
    answers = {url: api.create(url) for url in MALFORMED}
    wrong = {url: response.text for url, response in answers.items()
             if response.status_code != 400 or response.json()["error"]["param"] != "url"
             or response.json()["error"]["code"] != "invalid_url"}
    assert wrong == {}


PUBLIC = [
    f"http://{PUBLIC_V4}/hook",
    f"https://[{PUBLIC_V6}]:8443/hook",
    "http://[::ffff:93.184.216.34]/",
    "http://[64:ff9b::5db8:d822]/",  # NAT64 of the public address
    "https://hooks.public.test/tuneforge?tenant=alpha",
    "HTTPS://HOOKS.PUBLIC.TEST./x",
    "https://not-in-dns-yet.test/hook",  # unresolvable now: checked again at connect time
    "http://1.1.1.1/",
]


def test_public_addresses_are_accepted(api):
    answers = {url: api.create(url) for url in PUBLIC}
    wrong = {url: response.text for url, response in answers.items()
             if response.status_code != 200 or response.json()["url"] != url}
    assert wrong == {}


def test_an_update_passes_the_same_policy(api):
    created = api.create("https://hooks.public.test/a").json()
    response = api.http.post(f"/v1/webhooks/{created['id']}", json={"url": "http://[::ffff:169.254.169.254]/"},
                             headers=api.headers())
    assert response.status_code == 400
    assert (response.json()["error"]["param"], response.json()["error"]["code"]) == ("url", "url_not_allowed")
    got = api.http.get(f"/v1/webhooks/{created['id']}", headers=api.headers()).json()
    assert got["url"] == "https://hooks.public.test/a"
    updated = api.http.post(f"/v1/webhooks/{created['id']}", json={"url": "https://hooks.public.test/b"},
                            headers=api.headers()).json()
    assert updated["url"] == "https://hooks.public.test/b" and "secret" not in updated
    events_only = api.http.post(f"/v1/webhooks/{created['id']}", json={"events": ["fine_tuning.job.failed"]},
                                headers=api.headers()).json()
    assert (events_only["url"], events_only["events"]) == ("https://hooks.public.test/b", ["fine_tuning.job.failed"])
    other = api.http.post(f"/v1/webhooks/{created['id']}", json={"url": "https://hooks.public.test/c"},
                          headers=api.headers(api.other_key))
    assert other.status_code == 404


# ---- the allow-list ---------------------------------------------------------------

def test_the_allow_list_permits_exactly_what_it_names(api):
    api.allow("127.0.0.1, 10.0.0.0/8,hooks.internal, [fd00::/8]")
    for url in ("http://127.0.0.1:9/hook", "http://2130706433/", "http://10.255.0.1/", "http://012.1/",
                "https://hooks.internal/x", "https://HOOKS.INTERNAL./x", "https://internal.corp.test/",
                "http://[fd00::5]/", f"http://{PUBLIC_V4}/"):
        assert api.create(url).status_code == 200, url
    for url in ("http://127.0.0.2/", "http://[::1]/", "http://localhost/", "http://192.168.0.1/",
                "http://169.254.169.254/", "https://metadata.corp.test/",
                "https://mixed.corp.test/", "http://[fc00::1]/", "http://172.16.0.1/"):
        response = api.create(url)
        assert response.status_code == 400 and response.json()["error"]["param"] == "url", url
    # a host name entry names that one host, not its subdomains nor the addresses it resolves to
    api.allow("hooks.internal")
    assert api.create("https://hooks.internal/").status_code == 200
    assert api.create("https://other.hooks.internal/").status_code == 400
    assert api.create("http://10.1.2.3/").status_code == 400


def test_allow_list_parsing():
    policy = EgressPolicy.parse(" 127.0.0.1 ,,10.0.0.0/8, Hooks.Internal., ::1, 2001:db8::/32 ")
    assert [str(n) for n in policy.allow_networks] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128", "2001:db8::/32"]
    assert policy.allow_hosts == frozenset({"hooks.internal"})
    assert EgressPolicy.parse("") == EgressPolicy.parse(None) == EgressPolicy()
    for bad in ("10.0.0.0/33", "300.1.1.1", "bad host", "hooks.internal/x", "a..b", "-x.test"):
        with pytest.raises(ValueError, match="TUNEFORGE_EGRESS_ALLOW"):
            EgressPolicy.parse(bad)


def test_check_url_is_usable_without_the_api():
    policy = EgressPolicy(resolver=resolve)
    assert policy.check_url("  https://hooks.public.test/x  ", param="eval.url") == "https://hooks.public.test/x"
    with pytest.raises(ApiError) as refused:
        policy.check_url("http://0x7f.1/", param="eval.url")
    assert (refused.value.status_code, refused.value.param, refused.value.code) == (400, "eval.url",
                                                                                   "url_not_allowed")


# ---- connect time ---------------------------------------------------------------------

@dataclass
class Listener:
    """An HTTP server on 127.0.0.1 that records each request and answers with `answer`."""

    answer: Callable[[BaseHTTPRequestHandler], None] | None = None
    tls: ssl.SSLContext | None = None
    requests: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                listener.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
                if listener.answer:
                    listener.answer(self)
                else:
                    self.send_response(200)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")

            do_GET = do_POST = _any

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners():
    made: list[Listener] = []

    def make(answer=None) -> Listener:
        made.append(Listener(answer))
        return made[-1]

    yield make
    for listener in made:
        listener.close()


class Rebinding:
    """Public on the first lookup of each name (the check at input), loopback afterwards."""

    def __init__(self) -> None:
        self.lookups: dict[str, int] = {}

    def __call__(self, host: str) -> list[str]:
        self.lookups[host] = self.lookups.get(host, 0) + 1
        return [PUBLIC_V4] if self.lookups[host] == 1 else ["127.0.0.1"]


def test_dns_rebinding_is_refused_at_connect_time(listeners):
    listener = listeners()
    policy = EgressPolicy(resolver=Rebinding())
    url = f"http://rebind.test:{listener.port}/hook"
    assert policy.check_url(url, param="url") == url  # public when checked
    with policy.client(timeout=5.0) as client, pytest.raises(EgressDenied) as denied:
        client.post(url, json={"x": 1})
    assert "loopback" in denied.value.reason
    assert isinstance(denied.value, httpx.ConnectError)

    async def post_async() -> None:
        async with policy.async_client(timeout=5.0) as client:
            await client.post(url, json={"x": 1})

    with pytest.raises(EgressDenied):
        asyncio.run(post_async())
    assert listener.requests == []


def test_the_client_connects_to_the_checked_address_and_keeps_the_host_name(listeners):
    listener = listeners()
    policy = EgressPolicy.parse("127.0.0.1", resolver=resolve)  # loop.test -> 127.0.0.1
    with policy.client(timeout=5.0) as client:
        assert client.get(f"http://loop.test:{listener.port}/a").status_code == 200
        assert client.get(f"http://2130706433:{listener.port}/b").status_code == 200

    async def get_async() -> int:
        async with policy.async_client(timeout=5.0) as client:
            return (await client.get(f"http://loop.test:{listener.port}/c")).status_code

    assert asyncio.run(get_async()) == 200
    assert [(r["path"], r["headers"]["Host"]) for r in listener.requests] == [
        ("/a", f"loop.test:{listener.port}"), ("/b", f"2130706433:{listener.port}"),
        ("/c", f"loop.test:{listener.port}")]


@pytest.mark.parametrize("url", ["http://2130706433:{port}/", "http://127.1:{port}/", "http://[::ffff:7f00:1]:{port}/",
                                 "http://localhost:{port}/", "http://loop.test:{port}/"])
def test_the_client_refuses_what_check_url_refuses(listeners, url):
    listener = listeners()
    with EgressPolicy(resolver=resolve).client(timeout=5.0) as client, pytest.raises(EgressDenied):
        client.get(url.format(port=listener.port))
    assert listener.requests == []


def test_the_client_ignores_proxy_variables_and_refuses_options_that_bypass_it(listeners, monkeypatch):
    target, proxy = listeners(), listeners()
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with EgressPolicy.parse("127.0.0.1").client(timeout=5.0) as client:
        assert client.get(f"http://127.0.0.1:{target.port}/direct").status_code == 200
    assert len(target.requests) == 1 and proxy.requests == []
    for option in ({"transport": httpx.HTTPTransport()}, {"follow_redirects": True}, {"proxy": "http://x"},
                   {"trust_env": True}):
        with pytest.raises(TypeError):
            EgressPolicy().client(**option)


def test_a_redirect_is_never_followed_by_default(listeners):
    elsewhere = listeners()

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(307)
        handler.send_header("location", f"http://127.0.0.1:{elsewhere.port}/stolen")
        handler.send_header("content-length", "0")
        handler.end_headers()

    first = listeners(redirect)
    with EgressPolicy.parse("127.0.0.1").client(timeout=5.0) as client:
        response = client.post(f"http://127.0.0.1:{first.port}/hook", json={})
    assert response.status_code == 307 and elsewhere.requests == []


def test_tls_names_and_verifies_the_url_host_while_connecting_to_the_checked_address(tmp_path):
    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path, "hooks.tls.test")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    seen_names: list[str | None] = []
    server_context.sni_callback = lambda _sock, name, _ctx: seen_names.append(name)
    listener = Listener(tls=server_context)
    try:
        client_context = ssl.create_default_context(cafile=str(cert))
        names = {"hooks.tls.test": ["127.0.0.1"], "wrong.tls.test": ["127.0.0.1"]}
        policy = EgressPolicy.parse("127.0.0.1", resolver=lambda host: names[host])
        with policy.client(timeout=5.0, verify=client_context) as client:
            assert client.get(f"https://hooks.tls.test:{listener.port}/ok").status_code == 200
            with pytest.raises(httpx.ConnectError):  # the certificate does not name this host
                client.get(f"https://wrong.tls.test:{listener.port}/no")
        assert seen_names[:2] == ["hooks.tls.test", "wrong.tls.test"]
        assert [r["path"] for r in listener.requests] == ["/ok"]
    finally:
        listener.close()



def test_default_clients_share_one_verifying_context_that_refuses_an_unknown_certificate(tmp_path):
    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path, "hooks.tls.test")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    listener = Listener(tls=server_context)
    try:
        policy = EgressPolicy.parse("127.0.0.1", resolver=lambda host: ["127.0.0.1"])
        with policy.client(timeout=5.0) as first, policy.client(timeout=5.0) as second:
            contexts = [client._transport._pool._ssl_context for client in (first, second)]  # noqa: SLF001
            with pytest.raises(httpx.ConnectError):  # signed by no CA of certifi's bundle
                first.get(f"https://hooks.tls.test:{listener.port}/no")
        asynchronous = policy.async_client(timeout=5.0)
        contexts.append(asynchronous._transport._pool._ssl_context)  # noqa: SLF001
        asyncio.run(asynchronous.aclose())
        assert contexts[0] is contexts[1] is contexts[2] is verified_context()
        assert contexts[0].verify_mode == ssl.CERT_REQUIRED and contexts[0].check_hostname
        with policy.client(timeout=5.0, verify=False) as unverified:
            assert unverified._transport._pool._ssl_context.verify_mode == ssl.CERT_NONE  # noqa: SLF001
        assert listener.requests == []
    finally:
        listener.close()

def _self_signed(tmp_path, name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


# ---- webhook deliveries: only our reasons ------------------------------------------------

def _finish_a_job(platform: Platform, tenant_name: str) -> None:
    with platform.db.session() as session:
        tenant = tenant_repo.by_name(session, tenant_name)
        job = Job(job_id=new_id("ftjob"), tenant_id=tenant.tenant_id, model="tiny-base", base_model_sha256="0" * 64,
                  training_file="file-x", status="running", attempt=1, seed=1,
                  request=JobRequest(model="tiny-base", training_file="file-x"), result_files=[],
                  request_hash="0" * 64, created_at=int(time.time()))
        session.add(job)
    with platform.db.session() as session:
        transition(session, job_repo.get_for_update(session, job.job_id), JobStatus.FAILED, "test")


def _deliver(api: Api, egress: EgressPolicy) -> None:
    dispatcher = Dispatcher(api.platform, egress=egress)
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.stop()


def _deliveries(api: Api, endpoint_id: str) -> httpx.Response:
    response = api.http.get(f"/v1/webhooks/{endpoint_id}/deliveries", headers=api.headers())
    assert response.status_code == 200
    return response


def test_a_rebound_webhook_is_never_delivered_and_records_only_our_reason(api, listeners):
    listener = listeners()
    rebinding = Rebinding()
    api.http.app.state.egress_resolver = rebinding
    created = api.create(f"http://rebind.test:{listener.port}/hook")
    assert created.status_code == 200, created.text
    _finish_a_job(api.platform, "alpha")
    _deliver(api, EgressPolicy.from_settings(api.platform.settings, resolver=rebinding))
    [delivery] = _deliveries(api, created.json()["id"]).json()["data"]
    assert (delivery["status"], delivery["attempts"]) == ("pending", 1)
    assert (delivery["last_status_code"], delivery["last_error"]) == (None, "address not allowed")
    assert listener.requests == []


def test_a_redirecting_webhook_receiver_is_not_followed(api, listeners):
    elsewhere = listeners()

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("location", f"http://127.0.0.1:{elsewhere.port}/stolen")
        handler.send_header("content-length", "0")
        handler.end_headers()

    receiver = listeners(redirect)
    api.allow("127.0.0.1")
    created = api.create(f"http://127.0.0.1:{receiver.port}/hook").json()
    _finish_a_job(api.platform, "alpha")
    _deliver(api, EgressPolicy.from_settings(api.platform.settings))
    [delivery] = _deliveries(api, created["id"]).json()["data"]
    assert (delivery["last_status_code"], delivery["last_error"]) == (302, "redirect not followed")
    assert len(receiver.requests) == 1 and elsewhere.requests == []


def test_the_receivers_words_never_reach_the_deliveries_api(api, listeners):
    planted = f"internal-{uuid.uuid4().hex}"

    def error_with_body(handler: BaseHTTPRequestHandler) -> None:
        body = f"db password for {planted}".encode()
        handler.send_response(503, f"Unavailable {planted}")
        handler.send_header("content-length", str(len(body)))
        handler.send_header("x-detail", planted)
        handler.end_headers()
        handler.wfile.write(body)

    def not_http(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(f"SSH-2.0-{planted}\r\n\r\n".encode())
        handler.close_connection = True

    api.allow("127.0.0.1")
    failing = api.create(f"http://127.0.0.1:{listeners(error_with_body).port}/hook").json()
    garbled = api.create(f"http://127.0.0.1:{listeners(not_http).port}/hook").json()
    closed_port = _closed_port()
    refused = api.create(f"http://127.0.0.1:{closed_port}/hook").json()
    _finish_a_job(api.platform, "alpha")
    _deliver(api, EgressPolicy.from_settings(api.platform.settings))

    shown = {}
    for endpoint in (failing, garbled, refused):
        response = _deliveries(api, endpoint["id"])
        assert planted not in response.text
        [delivery] = response.json()["data"]
        shown[endpoint["id"]] = (delivery["last_status_code"], delivery["last_error"])
    assert shown[failing["id"]] == (503, "HTTP 503")
    assert shown[garbled["id"]] == (None, "invalid HTTP response")
    assert shown[refused["id"]] == (None, "connection refused")
    with api.platform.db.session() as session:  # not stored either
        assert all(planted not in (row.last_error or "") for row in session.query(WebhookDelivery))


def test_excerpts_stored_before_are_no_longer_shown(api):
    planted = f"internal-{uuid.uuid4().hex}"
    created = api.create("https://hooks.public.test/hook").json()
    _finish_a_job(api.platform, "alpha")
    with api.platform.db.session() as session:
        row = session.query(WebhookDelivery).one()
        row.last_status_code, row.last_error = 502, f"HTTP 502: {planted}"
    assert _deliveries(api, created["id"]).json()["data"][0]["last_error"] == "HTTP 502"
    with api.platform.db.session() as session:
        row = session.query(WebhookDelivery).one()
        row.last_status_code, row.last_error = None, f"ConnectError: [Errno 111] {planted}"
    response = _deliveries(api, created["id"])
    assert planted not in response.text and response.json()["data"][0]["last_error"] == "connection failed"
    with api.platform.db.session() as session:
        row = session.query(WebhookDelivery).one()
        row.last_error = f"timed out after 10 s (ReadTimeout {planted})"
    assert _deliveries(api, created["id"]).json()["data"][0]["last_error"] == "timed out after 10 s"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_every_forbidden_literal_is_refused_by_the_client_too():
    """Connect-time and input checks agree on the address forms (no connection is made:
    each is refused before one would be)."""
    policy = EgressPolicy(resolver=resolve)
    literal_forms = [url for url in FORBIDDEN if "@" not in url and "%" not in url and ".test" not in url
                     and "internal" not in url]
    for url in literal_forms:
        with pytest.raises(EgressDenied):
            policy.addresses_for(httpx.URL(url).raw_host.decode() if "0177" not in url else "0177.0.0.1")
    assert policy.addresses_for(PUBLIC_V4) == [PUBLIC_V4]
    assert policy.addresses_for("hooks.public.test") == [PUBLIC_V4, PUBLIC_V6]
    assert policy.addresses_for("::ffff:93.184.216.34") == [PUBLIC_V4]
    assert ipaddress.ip_address(policy.addresses_for("1.1.1.1")[0]).is_global


# -- libraries that take no transport of ours: urllib3 / requests (MLflow's client) --------------

@pytest.fixture
def guarded_urllib3(monkeypatch):
    from urllib3.util import connection

    monkeypatch.setattr(connection, "create_connection", connection.create_connection)  # put back afterwards
    from tuneforge.security.urllib3_guard import guard_urllib3

    return guard_urllib3


def test_requests_pass_the_policy_at_connect_time_redirects_included(listeners, guarded_urllib3):
    import requests

    inside = listeners()

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("location", f"http://127.0.0.1:{inside.port}/inside")
        handler.send_header("content-length", "0")
        handler.end_headers()

    rebinding = Rebinding()
    guarded_urllib3(EgressPolicy(resolver=rebinding))
    with pytest.raises(requests.ConnectionError, match="egress refused"):
        requests.get(f"http://127.0.0.1:{inside.port}/direct", timeout=5)
    assert rebinding.lookups == {}  # a literal is checked without a lookup
    with pytest.raises(requests.ConnectionError, match="loopback"):
        rebinding("rebind.test")  # its first (public) answer went to the check at input
        requests.get(f"http://rebind.test:{inside.port}/rebound", timeout=5)
    outside = listeners(redirect)
    guarded_urllib3(EgressPolicy.parse("rebind.test", resolver=rebinding))  # the server's host only
    with pytest.raises(requests.ConnectionError, match="egress refused"):
        requests.get(f"http://rebind.test:{outside.port}/hop", timeout=5)  # its redirect to 127.0.0.1 is not followed
    assert [r["path"] for r in outside.requests] == ["/hop"] and inside.requests == []


def test_requests_connect_to_the_checked_address_and_exempt_hosts_pass(listeners, guarded_urllib3):
    import requests

    listener = listeners()
    guarded_urllib3(EgressPolicy.parse("127.0.0.1", resolver=resolve))
    assert requests.get(f"http://127.0.0.1:{listener.port}/a", timeout=5).status_code == 200
    guarded_urllib3(EgressPolicy(resolver=resolve), exempt=["localhost"])  # the operator's own server
    assert requests.get(f"http://localhost:{listener.port}/b", timeout=5).status_code == 200
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{listener.port}/c", timeout=5)
    assert [r["path"] for r in listener.requests] == ["/a", "/b"]
