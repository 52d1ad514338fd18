"""Job event streams (`GET /v1/fine_tuning/jobs/{id}/events?stream=true`) on a real server:
every event carries its id and a reconnect with Last-Event-ID gets exactly what it missed; a
committed event reaches an open stream through the notifier (the poll is set too long to matter);
100 open streams leave the server answering another tenant; a tenant's streams are bounded (429
with Retry-After) and a closed stream gives its slot back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import httpx
import psycopg
import pytest

from tests.helpers.net import free_port, wait_until
from tests.helpers.platform import add_running_job
from tuneforge.db.listen import libpq_conninfo
from tuneforge.db.notify import CHANNEL
from tuneforge.db.repos import events
from tuneforge.db.repos import jobs as job_repo
from tuneforge.domain.ids import new_id
from tuneforge.domain.status import JobStatus
from tuneforge.server import ControlPlane
from tuneforge.services.training.transitions import transition
from tuneforge.settings import Settings

WAIT_S = 30.0  # generous: every wait ends as soon as what it waits for arrives
NEVER_S = 3600.0  # a poll interval no test lives to see: only a notification can wake the stream


@pytest.fixture
def start_plane(tmp_path, database_url):
    """Starts a control plane (API only) on a free port with the given settings."""
    planes: list[ControlPlane] = []

    def start(**overrides) -> ControlPlane:
        settings = Settings(home=tmp_path / "home", database_url=database_url, port=free_port(), **overrides)
        planes.append(ControlPlane(settings, run_scheduler=False).start_in_background())
        return planes[-1]

    yield start
    for plane in planes:
        plane.close()


def _events_url(job_id: str) -> str:
    return f"/v1/fine_tuning/jobs/{job_id}/events?stream=true"


def _auth(key: str, last_event_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


def _add_events(plane: ControlPlane, job_id: str, *messages: str) -> None:
    with plane.platform.db.session() as session:
        job = job_repo.get_for_update(session, job_id)
        for message in messages:
            events.add(session, job, message)


def _cancel(plane: ControlPlane, job_id: str) -> None:
    with plane.platform.db.session() as session:
        transition(session, job_repo.get_for_update(session, job_id), JobStatus.CANCELLED, "cancelled by the test")


def _stored_ids(plane: ControlPlane, tenant_id: str, job_id: str) -> list[str]:
    with plane.platform.db.session() as session:
        return [e.event_id for e in events.since(session, tenant_id, job_id, 0)]


async def _read(lines: AsyncIterator[str], *, comments: bool = False) -> dict[str, str]:
    """The next message of a stream, as its fields (`id`, `data`; `comment` for a comment line)."""
    fields: dict[str, str] = {}
    async for line in lines:
        if not line:
            if fields:
                return fields
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if not name:
            if comments:
                return {"comment": value}
            continue
        fields[name] = value
    raise AssertionError(f"the stream ended (last fields: {fields})")


async def _next(lines: AsyncIterator[str], **kwargs) -> dict[str, str]:
    return await asyncio.wait_for(_read(lines, **kwargs), WAIT_S)


async def _refused(client: httpx.AsyncClient, job_id: str, key: str) -> httpx.Response:
    """A stream request expected to be refused up front; its answer, read whole. (Had it opened,
    the answer is returned at once with the stream left unread rather than waited for.)"""
    async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
        if response.status_code != 200:
            await response.aread()
        return response


def _client(plane: ControlPlane) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=plane.url, timeout=WAIT_S, limits=httpx.Limits(max_connections=300))


def test_every_event_has_its_id_and_a_resume_gets_exactly_what_was_missed(start_plane):
    plane = start_plane()
    key, tenant_id, job_id = add_running_job(plane.platform, "alpha")
    _add_events(plane, job_id, *(f"event {n}" for n in range(5)))

    async def scenario() -> list[dict[str, str]]:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = response.aiter_lines()
                before = [await _next(lines) for _ in range(3)]
            # away: two of the first five are unread, and two more events come meanwhile
            await asyncio.to_thread(_add_events, plane, job_id, "while away 1", "while away 2")
            resumed = _auth(key, last_event_id=before[-1]["id"])
            async with client.stream("GET", _events_url(job_id), headers=resumed) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                after = [await _next(lines) for _ in range(4)]
                await asyncio.to_thread(_cancel, plane, job_id)
                after.append(await _next(lines))
                done = await _next(lines)
                assert done == {"data": "[DONE]"}
                assert [line async for line in lines if line] == []  # and the stream ends there
        return before + after

    received = asyncio.run(scenario())
    assert [m["id"] for m in received] == _stored_ids(plane, tenant_id, job_id)  # none twice, none missing
    bodies = [json.loads(m["data"]) for m in received]
    assert [b["id"] for b in bodies] == [m["id"] for m in received]  # `id:` is the event's own id
    assert [b["message"] for b in bodies[3:6]] == ["event 3", "event 4", "while away 1"]
    assert bodies[-1]["data"]["status"] == "cancelled"
    wait_until(lambda: plane.platform.streams.open_streams() == 0, WAIT_S, "the streams' slots to come back")


def test_resuming_a_finished_job_after_its_last_event_gets_only_done(start_plane):
    plane = start_plane()
    key, tenant_id, job_id = add_running_job(plane.platform, "alpha")
    _add_events(plane, job_id, "only")
    _cancel(plane, job_id)
    last = _stored_ids(plane, tenant_id, job_id)[-1]

    async def scenario() -> list[str]:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key, last)) as response:
                return [line async for line in response.aiter_lines() if line]

    assert asyncio.run(scenario()) == ["data: [DONE]"]


def test_a_last_event_id_that_is_not_the_jobs_answers_400_and_holds_no_slot(start_plane):
    plane = start_plane()
    key, tenant_id, job_id = add_running_job(plane.platform, "alpha")
    other_key, other_tenant, other_job = add_running_job(plane.platform, "beta")
    _add_events(plane, job_id, "of alpha's job")
    _add_events(plane, other_job, "of beta's job")
    foreign = _stored_ids(plane, other_tenant, other_job)[0]
    with httpx.Client(base_url=plane.url, timeout=WAIT_S) as client:
        for last_event_id in ("ftevent-nope", foreign):
            response = client.get(_events_url(job_id), headers=_auth(key, last_event_id))
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["param"] == "Last-Event-ID" and error["code"] == "invalid_last_event_id"
            assert "Last-Event-ID" in error["message"] and last_event_id in error["message"]
        # another tenant's job stays a 404, whatever the header says
        assert client.get(_events_url(job_id), headers=_auth(other_key)).status_code == 404
    assert plane.platform.streams.open_streams() == 0


def test_a_committed_event_reaches_an_open_stream_through_the_notifier(start_plane, db_backend):
    plane = start_plane(stream_poll_s=NEVER_S)
    key, tenant_id, job_id = add_running_job(plane.platform, "alpha")
    _add_events(plane, job_id, "before the stream")

    async def scenario() -> list[str]:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                lines = response.aiter_lines()
                received = [json.loads((await _next(lines))["data"])["message"]]
                await asyncio.to_thread(_add_events, plane, job_id, "committed by this process")
                received.append(json.loads((await _next(lines))["data"])["message"])
                if db_backend == "postgresql":
                    # as another process would: its commit reaches this one only through LISTEN
                    listener = plane.platform.db.listen_for_events()
                    await asyncio.to_thread(wait_until, lambda: listener.connected, WAIT_S, "LISTEN")
                    await asyncio.to_thread(_insert_elsewhere, plane, job_id, "committed by another process")
                    received.append(json.loads((await _next(lines))["data"])["message"])
                return received

    expected = ["before the stream", "committed by this process"]
    if db_backend == "postgresql":
        expected.append("committed by another process")
    assert asyncio.run(scenario()) == expected


def _insert_elsewhere(plane: ControlPlane, job_id: str, message: str) -> None:
    """An event stored and announced over a connection of its own, outside this process's sessions."""
    with psycopg.connect(libpq_conninfo(plane.platform.db.url)) as conn:
        conn.execute("INSERT INTO job_events (event_id, job_id, attempt, level, event_type, message, created_at) "
                     "VALUES (%s, %s, 0, 'info', 'message', %s, %s)",
                     (new_id("ftevent"), job_id, message, int(time.time())))
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, job_id))


def test_without_a_notification_the_poll_still_delivers(start_plane):
    plane = start_plane(stream_poll_s=0.2, stream_listen=False)
    key, tenant_id, job_id = add_running_job(plane.platform, "alpha")

    async def scenario() -> str:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                lines = response.aiter_lines()
                await asyncio.to_thread(_insert_unannounced, plane, job_id)
                return json.loads((await _next(lines))["data"])["message"]

    assert asyncio.run(scenario()) == "unannounced"


def _insert_unannounced(plane: ControlPlane, job_id: str) -> None:
    """Stored through the engine, not a session: no commit hook, no notification of any kind."""
    from tuneforge.db.tables import JobEvent

    with plane.platform.db.engine.begin() as conn:
        conn.execute(JobEvent.__table__.insert().values(
            event_id=new_id("ftevent"), job_id=job_id, attempt=0, level="info", event_type="message",
            message="unannounced", created_at=int(time.time())))


def test_idle_streams_send_keep_alive_comments(start_plane):
    plane = start_plane(stream_keepalive_s=0.1)
    key, _tenant_id, job_id = add_running_job(plane.platform, "alpha")

    async def scenario() -> dict[str, str]:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                return await _next(response.aiter_lines(), comments=True)

    assert asyncio.run(scenario()) == {"comment": "keep-alive"}


def test_a_hundred_open_streams_leave_the_server_answering_and_the_bound_holds(start_plane):
    plane = start_plane(max_streams_per_tenant=40, stream_poll_s=NEVER_S)
    tenants = [add_running_job(plane.platform, f"streamer-{n}") for n in range(3)]
    for _key, _tenant_id, job_id in tenants:
        _add_events(plane, job_id, "first")
    other_key, _other_tenant, _other_job = add_running_job(plane.platform, "bystander")
    per_tenant = (40, 40, 20)

    async def scenario() -> None:
        async with _client(plane) as client, AsyncExitStack() as streams:
            opened = []
            for (key, _tenant_id, job_id), count in zip(tenants, per_tenant):
                for _ in range(count):
                    response = await streams.enter_async_context(
                        client.stream("GET", _events_url(job_id), headers=_auth(key)))
                    assert response.status_code == 200
                    opened.append((job_id, response.aiter_lines()))
            firsts = await asyncio.gather(*(_next(lines) for _job_id, lines in opened))
            assert {json.loads(m["data"])["message"] for m in firsts} == {"first"}
            assert plane.platform.streams.open_streams() == 100

            # over the bound: refused up front, in OpenAI's envelope, with Retry-After
            refused = await _refused(client, tenants[0][2], tenants[0][0])
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert refused.json()["error"]["code"] == "too_many_streams"

            # another tenant is answered while the hundred streams stay open
            answers = await asyncio.gather(*(
                [client.get("/v1/fine_tuning/jobs", headers=_auth(other_key)) for _ in range(20)]
                + [client.get("/healthz") for _ in range(5)]))
            assert [a.status_code for a in answers] == [200] * 25

            # and every open stream is still live: one commit per job reaches all of its streams
            for _key, _tenant_id, job_id in tenants:
                await asyncio.to_thread(_add_events, plane, job_id, "second")
            seconds = await asyncio.gather(*(_next(lines) for _job_id, lines in opened))
            assert {json.loads(m["data"])["message"] for m in seconds} == {"second"}

    asyncio.run(scenario())
    wait_until(lambda: plane.platform.streams.open_streams() == 0, WAIT_S, "every slot to come back")


def test_a_closed_stream_gives_its_slot_back(start_plane):
    plane = start_plane(max_streams_per_tenant=1)
    key, tenant_id, job_id = add_running_job(plane.platform, "alpha")
    _add_events(plane, job_id, "first")
    streams = plane.platform.streams

    async def scenario() -> None:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                lines = response.aiter_lines()  # held: a dropped line iterator closes the connection
                await _next(lines)
                assert streams.open_streams(tenant_id) == 1
                assert (await _refused(client, job_id, key)).status_code == 429
            # the client hung up: the server notices, and the slot is free again
            await asyncio.to_thread(wait_until, lambda: streams.open_streams(tenant_id) == 0, WAIT_S,
                                    "the closed stream's slot to come back")
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                await _next(lines)

    asyncio.run(scenario())
    wait_until(lambda: streams.open_streams(tenant_id) == 0, WAIT_S, "the second stream's slot to come back")


def test_stopping_the_server_ends_open_streams_without_done(start_plane):
    plane = start_plane(stream_poll_s=NEVER_S)
    key, _tenant_id, job_id = add_running_job(plane.platform, "alpha")
    _add_events(plane, job_id, "first")

    async def scenario() -> list[str]:
        async with _client(plane) as client:
            async with client.stream("GET", _events_url(job_id), headers=_auth(key)) as response:
                lines = response.aiter_lines()
                await _next(lines)
                closing = asyncio.create_task(asyncio.to_thread(plane.close))
                rest = [line async for line in lines if line]
                await closing
                return rest

    assert asyncio.run(scenario()) == []  # no [DONE]: the job has not finished; a client resumes
    assert plane.platform.streams.open_streams() == 0
