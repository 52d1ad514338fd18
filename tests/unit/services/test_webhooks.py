"""Webhook deliveries: the outbox written with the status change, signatures, retries with
backoff, receivers that hang, and two dispatchers sharing one database.

A real HTTP receiver listens on 127.0.0.1; job rows are moved with the one state machine
(services/transitions.transition), as the scheduler and trainer reports do."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from sqlalchemy import select

from tests.helpers.platform import add_tenant, make_platform
from tuneforge.db.repos import jobs as job_repo
from tuneforge.db.repos import tenants as tenant_repo
from tuneforge.db.tables import Job, WebhookDelivery
from tuneforge.domain.ids import new_id
from tuneforge.domain.job_config import JobRequest
from tuneforge.domain.status import JobStatus
from tuneforge.security.egress import EgressPolicy
from tuneforge.services.context import Platform
from tuneforge.services.training.transitions import transition
from tuneforge.services.webhooks import subscriptions as webhooks
from tuneforge.services.webhooks.delivery import Dispatcher, backoff_s
from tuneforge.settings import Settings

# ---- a receiver ------------------------------------------------------------------


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers POSTs with the scripted statuses in order, then 200; holds each request up to
    `hold_s` (until `release` is set) to play a receiver that hangs."""

    statuses: list[int] = field(default_factory=list)
    hold_s: float = 0.0
    calls: list[Call] = field(default_factory=list)
    contacted: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    receiver.calls.append(Call(self.path, dict(self.headers.items()), body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.contacted.set()
                if receiver.hold_s:
                    receiver.release.wait(receiver.hold_s)
                try:
                    self.send_response(status)
                    self.send_header("content-length", "7")
                    self.end_headers()
                    self.wfile.write(b"receipt")
                except OSError:
                    pass  # the dispatcher gave up waiting and closed the connection

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class FakeClock:
    """Starts on the next whole second (so offsets add exactly), after any event made so far."""

    def __init__(self) -> None:
        self.now_s = float(math.ceil(time.time()))

    def __call__(self) -> float:
        return self.now_s


# ---- fixtures and helpers --------------------------------------------------------

@pytest.fixture
def closing():
    """Receivers, dispatchers and platforms a test made, closed whatever the test's outcome."""
    things: list = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Dispatcher):
            thing.stop()
        elif isinstance(thing, Platform):
            thing.db.dispose()
        else:
            thing.close()


def platform_for(tmp_path, database_url, **overrides) -> Platform:
    # the receivers listen on loopback, which the egress policy refuses unless allow-listed
    settings = {"webhook_backoff_s": 10.0, "webhook_backoff_max_s": 3600.0, "webhook_max_attempts": 8,
                "webhook_timeout_s": 5.0, "webhook_poll_s": 0.05, "egress_allow": "127.0.0.1", **overrides}
    return make_platform(tmp_path, database_url, **settings)


def tenant_id(platform: Platform, name: str) -> str:
    add_tenant(platform, name)
    with platform.db.session() as session:
        return tenant_repo.by_name(session, name).tenant_id


def register(platform: Platform, tenant: str, url: str, events: list[str] | None = None) -> tuple[str, str]:
    with platform.db.session() as session:
        row, secret = webhooks.register(session, tenant, url, events, sealer=platform.sealer,
                                        egress=EgressPolicy.from_settings(platform.settings))
        assert row.secret != secret and platform.sealer.open(row.secret) == secret  # stored sealed
        return row.endpoint_id, secret


def running_job(platform: Platform, tenant: str) -> str:
    with platform.db.session() as session:
        job = Job(job_id=new_id("ftjob"), tenant_id=tenant, model="tiny-base", base_model_sha256="0" * 64,
                  training_file="file-x", status=JobStatus.RUNNING.value, attempt=1, seed=1,
                  request=JobRequest(model="tiny-base", training_file="file-x"),
                  result_files=[], request_hash="0" * 64, created_at=int(time.time()))
        session.add(job)
        return job.job_id


def finish(platform: Platform, job_id: str, status: JobStatus) -> None:
    with platform.db.session() as session:
        job = job_repo.get_for_update(session, job_id)
        if status == JobStatus.SUCCEEDED:
            job.fine_tuned_model = f"ft:tiny-base:alpha::{job_id[-6:]}"
        error = {"code": "training_failed", "message": "loss diverged", "param": None} \
            if status == JobStatus.FAILED else None
        transition(session, job, status, f"test: {status.value}", error=error)


def deliveries(platform: Platform) -> list[WebhookDelivery]:
    with platform.db.session() as session:
        return list(session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.pk)))


def drain(dispatcher: Dispatcher) -> None:
    while dispatcher.run_once():
        pass


def wait_until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# ---- signatures -------------------------------------------------------------------

def test_signature_matches_the_standard_webhooks_reference_vector():
    # the example of the Standard Webhooks specification, which OpenAI's webhooks follow
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = webhooks.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {"Webhook-Id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "Webhook-Timestamp": "1614265330",
               "Webhook-Signature": "v1,bm90IGl0 " + signature}  # a rotated-out signature first
    assert webhooks.verify_signature(secret, headers, body, now_s=1614265330 + 299) == {"test": 2432232314}


def test_the_openai_sdk_verifies_and_parses_our_events():
    secret = webhooks.new_secret()
    event = {"id": "evt_0123", "object": "event", "created_at": 1764000000, "type": "fine_tuning.job.succeeded",
             "data": {"id": "ftjob-abc", "status": "succeeded", "fine_tuned_model": "ft:m:t::x", "error": None}}
    body = webhooks.encode_body(event)
    headers = webhooks.signed_headers(secret, "evt_0123", body, int(time.time()))
    client = openai.OpenAI(api_key="unused", webhook_secret=secret, base_url="http://127.0.0.1:9/v1")
    parsed = client.webhooks.unwrap(body, headers)
    assert type(parsed).__name__ == "FineTuningJobSucceededWebhookEvent"
    assert (parsed.id, parsed.data.id, parsed.created_at) == ("evt_0123", "ftjob-abc", 1764000000)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(body + b" ", headers)


@pytest.mark.parametrize("tamper, reason", [
    (lambda s, h, b: (s, h, b + b" "), "no v1 signature"),
    (lambda s, h, b: (webhooks.new_secret(), h, b), "no v1 signature"),
    (lambda s, h, b: (s, {**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) - 301)}, b), "tolerance 300"),
    (lambda s, h, b: (s, {k: v for k, v in h.items() if k != "webhook-id"}, b), "missing webhook-id"),
    (lambda s, h, b: (s, {**h, "webhook-signature": h["webhook-signature"].replace("v1,", "v2,")}, b),
     "no v1 signature"),
])
def test_verify_rejects_a_changed_body_wrong_secret_old_timestamp_and_missing_headers(tamper, reason):
    secret = webhooks.new_secret()
    body = webhooks.encode_body({"id": "evt_1", "type": "fine_tuning.job.succeeded"})
    headers = webhooks.signed_headers(secret, "evt_1", body, int(time.time()))
    assert webhooks.verify_signature(secret, headers, body)["id"] == "evt_1"
    with pytest.raises(webhooks.InvalidSignature, match=reason):
        webhooks.verify_signature(*tamper(secret, headers, body))


# ---- the outbox and one delivery per endpoint --------------------------------------

def test_each_outcome_reaches_each_subscribed_endpoint_once_signed(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url)
    receiver = Receiver()
    dispatcher = Dispatcher(platform)
    closing += [platform, receiver, dispatcher]
    alpha, beta = tenant_id(platform, "alpha"), tenant_id(platform, "beta")
    every, every_secret = register(platform, alpha, receiver.url("/every"))
    _only, only_secret = register(platform, alpha, receiver.url("/cancelled"), ["fine_tuning.job.cancelled"])
    register(platform, beta, receiver.url("/beta"))
    jobs = {status: running_job(platform, alpha) for status in
            (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)}
    for status, job_id in jobs.items():
        finish(platform, job_id, status)
    # not terminal: no event
    queued = running_job(platform, alpha)
    with platform.db.session() as session:
        transition(session, job_repo.get_for_update(session, queued), JobStatus.QUEUED, "test: requeued")

    rows = deliveries(platform)
    assert [(r.endpoint_id == every, r.status, r.attempts) for r in rows] == \
        [(True, "pending", 0), (True, "pending", 0), (True, "pending", 0), (False, "pending", 0)]
    drain(dispatcher)

    by_path: dict[str, dict[str, dict]] = {}  # path -> event type -> event (sent concurrently: any order)
    for call in receiver.calls:
        secret = every_secret if call.path == "/every" else only_secret
        event = webhooks.verify_signature(secret, call.headers, call.body)
        assert call.headers["webhook-id"] == event["id"] and event["id"].startswith("evt_")
        by_path.setdefault(call.path, {})[event["type"]] = event
    assert len(receiver.calls) == 4
    assert sorted(by_path) == ["/cancelled", "/every"]  # beta's endpoint hears nothing of alpha's jobs
    assert {kind: event["data"]["id"] for kind, event in by_path["/every"].items()} == {
        "fine_tuning.job.succeeded": jobs[JobStatus.SUCCEEDED],
        "fine_tuning.job.failed": jobs[JobStatus.FAILED],
        "fine_tuning.job.cancelled": jobs[JobStatus.CANCELLED]}
    assert {kind: event["data"]["id"] for kind, event in by_path["/cancelled"].items()} == {
        "fine_tuning.job.cancelled": jobs[JobStatus.CANCELLED]}
    succeeded = by_path["/every"]["fine_tuning.job.succeeded"]
    failed = by_path["/every"]["fine_tuning.job.failed"]
    assert succeeded["object"] == "event" and succeeded["data"]["status"] == "succeeded"
    assert succeeded["data"]["fine_tuned_model"].startswith("ft:tiny-base:alpha::")
    assert failed["data"]["error"]["code"] == "training_failed" and failed["data"]["status"] == "failed"
    rows = deliveries(platform)
    assert [(r.status, r.attempts, r.last_status_code) for r in rows] == [("delivered", 1, 200)] * 4
    drain(dispatcher)
    assert len(receiver.calls) == 4  # delivered events are never sent again


def test_the_outbox_row_rolls_back_with_the_status_change(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url)
    closing.append(platform)
    alpha = tenant_id(platform, "alpha")
    register(platform, alpha, "http://127.0.0.1:9/hook")
    job_id = running_job(platform, alpha)
    with pytest.raises(RuntimeError, match="after the change"), platform.db.session() as session:
        transition(session, job_repo.get_for_update(session, job_id), JobStatus.SUCCEEDED, "test")
        raise RuntimeError("something failed after the change")
    assert deliveries(platform) == []
    with platform.db.session() as session:
        assert job_repo.status_of(session, alpha, job_id) == "running"


def test_a_deleted_endpoint_gets_nothing_more(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url)
    receiver = Receiver()
    dispatcher = Dispatcher(platform)
    closing += [platform, receiver, dispatcher]
    alpha = tenant_id(platform, "alpha")
    endpoint, _secret = register(platform, alpha, receiver.url())
    finish(platform, running_job(platform, alpha), JobStatus.CANCELLED)
    with platform.db.session() as session:
        webhooks.delete(session, alpha, endpoint)
    finish(platform, running_job(platform, alpha), JobStatus.CANCELLED)
    drain(dispatcher)
    assert receiver.calls == []
    assert [(r.status, r.attempts, r.last_error) for r in deliveries(platform)] == [
        ("failed", 0, "the webhook endpoint was deleted")]


# ---- retries ------------------------------------------------------------------------

def test_two_500s_then_200_is_delivered_on_the_third_attempt_after_10_then_20_s(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url, webhook_backoff_s=10.0)
    receiver = Receiver(statuses=[500, 500])
    closing += [platform, receiver]
    alpha = tenant_id(platform, "alpha")
    register(platform, alpha, receiver.url())
    finish(platform, running_job(platform, alpha), JobStatus.SUCCEEDED)
    clock = FakeClock()
    dispatcher = Dispatcher(platform, clock=clock)
    closing.append(dispatcher)
    start = clock.now_s

    hits = []
    for offset_s in (0.0, 9.9, 10.0, 29.9, 30.0, 31.0):  # due at +0, then +10, then +10+20
        clock.now_s = start + offset_s
        drain(dispatcher)
        hits.append(len(receiver.calls))
    assert hits == [1, 1, 2, 2, 3, 3]
    [row] = deliveries(platform)
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("delivered", 3, 200, None)
    assert row.delivered_at == int(start + 30.0)
    assert len({call.headers["webhook-id"] for call in receiver.calls}) == 1  # one event, retried


def test_backoff_doubles_up_to_its_cap():
    settings = Settings(webhook_backoff_s=10.0, webhook_backoff_max_s=3600.0)
    assert [backoff_s(n, settings) for n in range(1, 10)] == \
        [10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0]
    assert backoff_s(10, settings) == 3600.0


def test_after_the_last_attempt_the_delivery_fails_with_the_last_error(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url, webhook_max_attempts=3, webhook_backoff_s=1.0)
    receiver = Receiver(statuses=[500] * 10)
    closing += [platform, receiver]
    alpha = tenant_id(platform, "alpha")
    register(platform, alpha, receiver.url())
    finish(platform, running_job(platform, alpha), JobStatus.FAILED)
    clock = FakeClock()
    dispatcher = Dispatcher(platform, clock=clock)
    closing.append(dispatcher)
    for _ in range(6):
        drain(dispatcher)
        clock.now_s += 100.0
    assert len(receiver.calls) == 3
    [row] = deliveries(platform)
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 3, 500)
    assert row.last_error == "HTTP 500"  # the receiver's body ("receipt") is never kept


# ---- receivers that hang ------------------------------------------------------------

def test_a_hanging_receiver_never_holds_up_a_job(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url, webhook_timeout_s=20.0)
    receiver = Receiver(hold_s=30.0)  # longer than the timeout: only `release` ends it early
    dispatcher = Dispatcher(platform)
    closing += [platform, receiver, dispatcher]
    alpha = tenant_id(platform, "alpha")
    register(platform, alpha, receiver.url())
    first, second = running_job(platform, alpha), running_job(platform, alpha)

    finish(platform, first, JobStatus.SUCCEEDED)  # no dispatcher runs: nothing can be sent inline
    assert receiver.calls == []
    assert [(r.status, r.attempts) for r in deliveries(platform)] == [("pending", 0)]

    dispatcher.start()
    assert receiver.contacted.wait(15)
    finish(platform, second, JobStatus.CANCELLED)  # while the first event's POST hangs
    in_flight, queued = deliveries(platform)
    # the first attempt has no outcome yet: the change above did not wait for it
    assert (in_flight.status, in_flight.attempts, in_flight.last_error, in_flight.last_status_code) == \
        ("pending", 1, None, None)
    assert queued.status == "pending" and queued.payload["type"] == "fine_tuning.job.cancelled"

    receiver.release.set()
    wait_until(lambda: [r.status for r in deliveries(platform)] == ["delivered", "delivered"])
    assert [r.attempts for r in deliveries(platform)] == [1, 1]


def test_a_receiver_slower_than_the_timeout_costs_one_attempt(tmp_path, database_url, closing):
    platform = platform_for(tmp_path, database_url, webhook_timeout_s=0.3, webhook_backoff_s=10.0)
    receiver = Receiver(hold_s=10.0)
    closing += [platform, receiver]
    alpha = tenant_id(platform, "alpha")
    register(platform, alpha, receiver.url())
    finish(platform, running_job(platform, alpha), JobStatus.SUCCEEDED)
    clock = FakeClock()
    dispatcher = Dispatcher(platform, clock=clock)
    closing.append(dispatcher)
    assert dispatcher.run_once() == 1
    [row] = deliveries(platform)
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
    assert row.last_error.startswith("timed out after 0.3 s")
    assert row.next_attempt_at == pytest.approx(clock.now_s + 10.0)


# ---- two control planes --------------------------------------------------------------

def test_two_dispatchers_on_one_database_never_send_an_event_twice(tmp_path, database_url, closing):
    platforms = [platform_for(tmp_path, database_url), platform_for(tmp_path, database_url)]
    receiver = Receiver()
    dispatchers = [Dispatcher(p) for p in platforms]
    closing += [*platforms, receiver, *dispatchers]
    alpha = tenant_id(platforms[0], "alpha")
    register(platforms[0], alpha, receiver.url())
    for _ in range(30):
        finish(platforms[0], running_job(platforms[0], alpha), JobStatus.SUCCEEDED)

    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(dispatcher: Dispatcher) -> None:
        try:
            start.wait()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if not dispatcher.run_once():
                    if all(r.status != "pending" for r in deliveries(dispatcher.platform)):
                        return
                    time.sleep(0.01)  # the rest is in the other dispatcher's hands
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in dispatchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert errors == []
    ids = [call.headers["webhook-id"] for call in receiver.calls]
    assert len(ids) == 30 and len(set(ids)) == 30
    assert {(r.status, r.attempts) for r in deliveries(platforms[0])} == {("delivered", 1)}
