"""The training API's broker (`services/training_api/broker.py`): per-model ordering by seq_id
(buffered early arrivals, resent seq_ids, skipped gaps), the cycles a co-training worker takes
(one op per model, forward_backward ops shared round-robin by tenant within the token budget),
the per-tenant limits, tenancy of every id, op results and failures, a lost worker, idle models
and pools let go (their state kept, restored with their next op), and the waits of futures and of
a worker's request for work (docs/tinker-wire.md §5.2-5.3)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.services.training_api import broker as broker_module
from tuneforge.services.training_api.broker import PROTO, RETRY_AFTER_S, Broker, Model, Op, Pool

BASE = "base-small"
OTHER_BASE = "base-other"


# ---- helpers -------------------------------------------------------------------------------------------
def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def make_broker(*, cycle_tokens: int = 1500, models_per_tenant: int = 16, queued_per_tenant: int = 64,
                launched: list[Pool] | None = None) -> Broker:
    sink = launched if launched is not None else []
    return Broker(cycle_tokens=cycle_tokens, models_per_tenant=models_per_tenant,
                  queued_per_tenant=queued_per_tenant, launch=sink.append)


def new_model(broker: Broker, tenant: str, *, base: str = BASE, model_seq_id: int = 0,
              session_id: str | None = None) -> Model:
    if session_id is None:
        session_id = broker.create_session(tenant, [], {}).session_id
    return broker.new_model(tenant, session_id, model_seq_id, base, {"rank": 8}, {})


def submit(broker: Broker, model: Model, kind: str, seq_id: int | None, *, tokens: int = 0, **kwargs: Any) -> Op:
    op = broker.op(model.tenant, kind, model.model_id, {"seq": seq_id}, tokens=tokens, **kwargs)
    assert broker.submit(model, seq_id, op) is op.future
    return op


async def work(broker: Broker, pool: Pool, results: list[dict[str, Any]] | None = None) -> list[Op]:
    """A worker's request for work, bounded: a broker that never answers fails the test, not hangs it."""
    return await asyncio.wait_for(broker.work(pool, results or []), 2.0)


def ok(op: Op, **body: Any) -> dict[str, Any]:
    return {"op_id": op.op_id, "ok": True, "json": body or {"done": op.op_id}}


def failed(op: Op, error: str, category: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"op_id": op.op_id, "ok": False, "error": error}
    if category is not None:
        result["category"] = category
    return result


def ids(ops: list[Op]) -> list[str]:
    return [op.op_id for op in ops]


def fb_tokens(ops: list[Op]) -> int:
    return sum(op.tokens for op in ops if op.kind == "forward_backward")


class Clock:
    """Stands in for the broker module's `time`: monotonic time moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 5000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(broker_module, "time", fake)
    return fake


# ---- ordering by seq_id --------------------------------------------------------------------------------
def test_ops_of_one_model_run_in_seq_order_one_per_cycle_each_after_the_previous_result():
    async def scenario() -> None:
        broker = make_broker()
        model = new_model(broker, "tenant-a")
        third = submit(broker, model, "forward_backward", 3, tokens=10)
        second = submit(broker, model, "optim_step", 2)
        assert sorted(model.buffered) == [2, 3] and not model.ready  # both wait for seq 1
        first = submit(broker, model, "forward_backward", 1, tokens=10)
        assert model.next_seq == 4 and not model.buffered and model.buffered_since is None
        pool = broker.pools[BASE]

        assert ids(await work(broker, pool, [])) == [first.op_id]
        assert broker.cycle(pool) == []  # seq 2 is ready but seq 1 has not come back
        assert not second.future.done.is_set()

        assert ids(await work(broker, pool, [ok(first, loss=1.5)])) == [second.op_id]
        assert first.future.body == {"loss": 1.5} and first.future.error is None
        assert broker.cycle(pool) == []

        assert ids(await work(broker, pool, [ok(second)])) == [third.op_id]
        assert second.future.done.is_set() and not third.future.done.is_set()
        assert broker.cycle(pool) == []

        done = asyncio.create_task(broker.work(pool, [ok(third, loss=0.5)]))
        await asyncio.sleep(0.01)
        assert third.future.body == {"loss": 0.5}
        broker.close()
        assert await asyncio.wait_for(done, 1.0) == []
        assert not pool.running and model.running is None

    run(scenario())


def test_one_op_per_model_per_cycle_but_every_model_in_the_cycle():
    broker = make_broker()
    one, two = new_model(broker, "tenant-a"), new_model(broker, "tenant-b")
    step = submit(broker, one, "optim_step", 1)
    submit(broker, one, "save", 2)
    create = submit(broker, two, "create", None)
    pool = broker.pools[BASE]
    assert sorted(ids(broker.cycle(pool))) == sorted([step.op_id, create.op_id])
    assert one.running is step and two.running is create
    assert [op.kind for op in one.ready] == ["save"]


def test_a_resent_seq_id_returns_the_same_future():
    async def scenario() -> None:
        broker = make_broker()
        model = new_model(broker, "tenant-a")
        second = submit(broker, model, "forward_backward", 2, tokens=5)  # buffered
        first = submit(broker, model, "forward_backward", 1, tokens=5)
        assert broker.resent(model, 1) is first.future
        assert broker.resent(model, 2) is second.future
        assert broker.resent(model, 3) is None
        other = new_model(broker, "tenant-a")
        assert broker.resent(other, 1) is None  # seq_ids are per model

        pool = broker.pools[BASE]
        assert ids(await work(broker, pool, [])) == [first.op_id]
        assert ids(await work(broker, pool, [ok(first)])) == [second.op_id]
        assert broker.resent(model, 1) is first.future and first.future.done.is_set()

    run(scenario())


def test_a_gap_is_skipped_only_once_it_is_gap_s_old(clock: Clock, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 0.0)  # an empty request for work answers at once

    async def scenario() -> None:
        broker = make_broker()
        model = new_model(broker, "tenant-a")
        first = submit(broker, model, "forward_backward", 1, tokens=5)
        third = submit(broker, model, "forward_backward", 3, tokens=5)  # seq 2 never comes
        buffered_at = clock.now
        assert model.buffered_since == buffered_at
        pool = broker.pools[BASE]
        assert ids(await work(broker, pool, [])) == [first.op_id]

        clock.now = buffered_at + 1.0
        assert await work(broker, pool, [ok(first)]) == []
        assert first.future.done.is_set() and model.next_seq == 2

        clock.now = buffered_at + broker_module.GAP_S - 0.01
        assert await work(broker, pool, []) == []
        assert model.buffered == {3: third}

        clock.now = buffered_at + broker_module.GAP_S
        assert ids(await work(broker, pool, [])) == [third.op_id]
        assert model.next_seq == 4 and not model.buffered and model.buffered_since is None

    run(scenario())


def test_a_gap_filled_before_gap_s_runs_in_order(clock: Clock):
    broker = make_broker()
    model = new_model(broker, "tenant-a")
    third = submit(broker, model, "optim_step", 3)
    clock.now += broker_module.GAP_S - 1.0
    second = submit(broker, model, "forward_backward", 2, tokens=5)
    first = submit(broker, model, "forward_backward", 1, tokens=5)
    assert [op.op_id for op in model.ready] == [first.op_id, second.op_id, third.op_id]
    assert model.next_seq == 4 and model.buffered_since is None


def test_a_second_gap_behind_a_filled_one_is_timed_from_when_the_first_was_filled(clock: Clock):
    broker = make_broker()
    model = new_model(broker, "tenant-a")
    third = submit(broker, model, "optim_step", 3)
    fifth = submit(broker, model, "optim_step", 5)  # seq 4 never comes
    clock.now += broker_module.GAP_S - 1.0
    first = submit(broker, model, "optim_step", 1)
    second = submit(broker, model, "optim_step", 2)
    assert list(model.ready) == [first, second, third] and model.buffered == {5: fifth}
    assert model.buffered_since == clock.now
    pool = broker.pools[BASE]
    for op in (first, second, third):
        assert broker.cycle(pool) == [op]
        model.running = None  # as the op's result coming back leaves it
    clock.now += broker_module.GAP_S - 0.5
    assert broker.cycle(pool) == []
    clock.now += 0.5
    assert broker.cycle(pool) == [fifth] and model.next_seq == 6


def test_a_held_request_for_work_notices_a_gap_once_it_is_old(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "GAP_S", 0.05)
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 3.0)

    async def scenario() -> None:
        broker = make_broker()
        model = new_model(broker, "tenant-a")
        first = submit(broker, model, "forward_backward", 1, tokens=5)
        third = submit(broker, model, "forward_backward", 3, tokens=5)
        pool = broker.pools[BASE]
        assert ids(await work(broker, pool, [])) == [first.op_id]
        started = time.monotonic()
        assert ids(await work(broker, pool, [ok(first)])) == [third.op_id]
        assert time.monotonic() - started < 1.0

    run(scenario())


# ---- the cycle's share of the token budget -------------------------------------------------------------
@pytest.mark.parametrize("big, small", [("tenant-a", "tenant-b"), ("tenant-z", "tenant-b")])
def test_a_tenants_large_batches_do_not_starve_another_tenants_small_one(big: str, small: str,
                                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 0.0)  # an empty request for work answers at once
    broker = make_broker(cycle_tokens=1500)
    big_ops = [submit(broker, new_model(broker, big), "forward_backward", 1, tokens=1000) for _ in range(4)]
    small_op = submit(broker, new_model(broker, small), "forward_backward", 1, tokens=100)
    pool = broker.pools[BASE]

    first = broker.cycle(pool)
    assert small_op.op_id in ids(first)
    assert len(first) == 2 and fb_tokens(first) == 1100  # one large batch fits beside the small one

    async def drain() -> list[list[Op]]:
        cycles, results = [first], [ok(op) for op in first]
        while True:
            ops = await work(broker, pool, results)
            if not ops:
                return cycles
            cycles.append(ops)
            results = [ok(op) for op in ops]

    cycles = run(drain())
    assert [len(ops) for ops in cycles] == [2, 1, 1, 1]  # each later cycle: one large batch alone
    assert sorted(op.op_id for ops in cycles for op in ops) == sorted(ids([*big_ops, small_op]))
    assert all(op.future.done.is_set() for op in [*big_ops, small_op])


def test_a_cycle_takes_one_op_even_when_it_alone_exceeds_the_budget():
    broker = make_broker(cycle_tokens=1500)
    alone = submit(broker, new_model(broker, "tenant-a"), "forward_backward", 1, tokens=5000)
    pool = broker.pools[BASE]
    assert ids(broker.cycle(pool)) == [alone.op_id]

    broker = make_broker(cycle_tokens=1500)
    huge = [submit(broker, new_model(broker, tenant), "forward_backward", 1, tokens=5000)
            for tenant in ("tenant-a", "tenant-b")]
    pool = broker.pools[BASE]
    first = broker.cycle(pool)
    assert len(first) == 1 and first[0].op_id in ids(huge)


def test_forward_backward_ops_alternate_between_tenants_within_the_budget():
    broker = make_broker(cycle_tokens=400)
    for tenant in ("tenant-a", "tenant-b"):
        for _ in range(3):
            submit(broker, new_model(broker, tenant), "forward_backward", 1, tokens=100)
    pool = broker.pools[BASE]
    first = broker.cycle(pool)
    assert fb_tokens(first) == 400
    assert sorted(op.tenant for op in first) == ["tenant-a", "tenant-a", "tenant-b", "tenant-b"]
    assert sorted(op.tenant for op in broker.cycle(pool)) == ["tenant-a", "tenant-b"]  # the rest


def test_a_tenant_over_the_budget_waits_while_another_still_fits():
    broker = make_broker(cycle_tokens=1000)
    a_first = submit(broker, new_model(broker, "tenant-a"), "forward_backward", 1, tokens=600)
    a_second = submit(broker, new_model(broker, "tenant-a"), "forward_backward", 1, tokens=600)
    b_ops = [submit(broker, new_model(broker, "tenant-b"), "forward_backward", 1, tokens=200) for _ in range(2)]
    pool = broker.pools[BASE]
    first = broker.cycle(pool)
    assert sorted(ids(first)) == sorted(ids([a_first, *b_ops]))
    assert fb_tokens(first) == 1000
    assert ids(broker.cycle(pool)) == [a_second.op_id]


def test_a_tenant_with_many_models_does_not_hold_back_another_for_more_than_a_cycle():
    broker = make_broker(cycle_tokens=1500)
    for _ in range(3):
        model = new_model(broker, "tenant-a")
        submit(broker, model, "forward_backward", 1, tokens=1000)
        submit(broker, model, "forward_backward", 2, tokens=1000)
    waiting = submit(broker, new_model(broker, "tenant-b"), "forward_backward", 1, tokens=1000)
    pool = broker.pools[BASE]

    async def two_cycles() -> list[str]:
        first = broker.cycle(pool)
        second = await work(broker, pool, [ok(op) for op in first])
        return ids(first) + ids(second)

    assert waiting.op_id in run(two_cycles())


def test_other_kinds_of_op_are_always_taken_beside_the_budgeted_batches():
    broker = make_broker(cycle_tokens=100)
    big = submit(broker, new_model(broker, "tenant-a"), "forward_backward", 1, tokens=5000)
    step = submit(broker, new_model(broker, "tenant-a"), "optim_step", 1)
    save = submit(broker, new_model(broker, "tenant-b"), "save", 1)
    create = submit(broker, new_model(broker, "tenant-b"), "create", None)
    small = submit(broker, new_model(broker, "tenant-b"), "forward_backward", 1, tokens=50)
    sample = broker.op("tenant-c", "sample", None, {"prompt": [1, 2]})
    assert broker.submit_to_pool(BASE, sample) is sample.future
    pool = broker.pools[BASE]

    first = broker.cycle(pool)
    assert sorted(ids(first)) == sorted(ids([big, step, save, create, sample]))
    assert set(pool.running) == set(ids(first)) and not pool.ops
    assert ids(broker.cycle(pool)) == [small.op_id]


def test_a_pool_is_launched_once_per_base_model():
    launched: list[Pool] = []
    broker = make_broker(launched=launched)
    submit(broker, new_model(broker, "tenant-a"), "create", None)
    submit(broker, new_model(broker, "tenant-b"), "create", None)
    assert [pool.base for pool in launched] == [BASE]
    submit(broker, new_model(broker, "tenant-a", base=OTHER_BASE), "create", None)
    assert [pool.base for pool in launched] == [BASE, OTHER_BASE]
    pool = broker.pools[BASE]
    assert broker.pool_by_id(pool.pool_id, pool.token) is pool
    with pytest.raises(ApiError) as refused:
        broker.pool_by_id(pool.pool_id, broker.pools[OTHER_BASE].token)
    assert refused.value.status_code == 401


# ---- limits ---------------------------------------------------------------------------------------------
def test_a_tenant_past_its_model_limit_is_told_to_retry():
    broker = make_broker(models_per_tenant=2)
    session = broker.create_session("tenant-a", [], {})
    new_model(broker, "tenant-a", session_id=session.session_id, model_seq_id=0)
    new_model(broker, "tenant-a", model_seq_id=0)  # in another session: counted all the same
    with pytest.raises(ApiError) as refused:
        new_model(broker, "tenant-a", session_id=session.session_id, model_seq_id=1)
    assert refused.value.status_code == 429
    assert refused.value.code == "too_many_models"
    assert refused.value.retry_after is not None and refused.value.retry_after > 0
    assert sum(model.tenant == "tenant-a" for model in broker.models.values()) == 2
    assert len(session.models) == 1
    new_model(broker, "tenant-b")  # another tenant's limit is its own


def test_a_finished_session_gives_its_models_places_back():
    broker = make_broker(models_per_tenant=2)
    session = broker.create_session("tenant-a", [], {})
    for seq in (0, 1):
        new_model(broker, "tenant-a", session_id=session.session_id, model_seq_id=seq)
    broker.finish("tenant-a", session.session_id)
    new_model(broker, "tenant-a")


def test_a_model_seq_id_is_used_once_per_session():
    broker = make_broker()
    session = broker.create_session("tenant-a", [], {})
    new_model(broker, "tenant-a", session_id=session.session_id, model_seq_id=3)
    with pytest.raises(ApiError) as refused:
        new_model(broker, "tenant-a", session_id=session.session_id, model_seq_id=3)
    assert refused.value.status_code == 400 and refused.value.param == "model_seq_id"


def test_a_tenant_past_its_queued_limit_is_told_to_retry_until_ops_finish():
    async def scenario() -> None:
        broker = make_broker(queued_per_tenant=3)
        model = new_model(broker, "tenant-a")
        ops = [submit(broker, model, "forward_backward", seq, tokens=5) for seq in (1, 2, 3)]
        futures = len(broker.futures)
        with pytest.raises(ApiError) as refused:
            broker.op("tenant-a", "forward_backward", model.model_id, {}, tokens=5)
        assert refused.value.status_code == 429
        assert refused.value.code == "too_many_requests"
        assert refused.value.retry_after == RETRY_AFTER_S
        assert len(broker.futures) == futures  # a refused op leaves nothing behind
        broker.op("tenant-b", "optim_step", None, {})  # another tenant's limit is its own

        pool = broker.pools[BASE]
        assert ids(await work(broker, pool, [])) == [ops[0].op_id]
        with pytest.raises(ApiError):
            broker.op("tenant-a", "optim_step", model.model_id, {})  # running still counts
        assert ids(await work(broker, pool, [ok(ops[0])])) == [ops[1].op_id]
        fourth = submit(broker, model, "optim_step", 4)
        with pytest.raises(ApiError):
            broker.op("tenant-a", "optim_step", model.model_id, {})
        assert ids(await work(broker, pool, [failed(ops[1], "bad batch", "user")])) == [ops[2].op_id]
        submit(broker, model, "optim_step", 5)  # a failed op frees its place too
        assert not fourth.future.done.is_set()

    run(scenario())


# ---- tenancy --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lookup, param", [("session", "session_id"), ("model", "model_id"),
                                           ("sampler", "sampling_session_id"), ("future", "request_id")])
def test_another_tenants_ids_are_not_found(lookup: str, param: str):
    broker = make_broker()
    session = broker.create_session("tenant-a", [], {})
    model = new_model(broker, "tenant-a", session_id=session.session_id)
    sampler = broker.new_sampler("tenant-a", session.session_id, 1, BASE, None, None)
    op = submit(broker, model, "create", None)
    owned = {"session": (session.session_id, session), "model": (model.model_id, model),
             "sampler": (sampler.sampler_id, sampler), "future": (op.op_id, op.future)}
    key, found = owned[lookup]
    assert getattr(broker, lookup)("tenant-a", key) is found
    for tenant, asked in (("tenant-b", key), ("tenant-a", key + "-missing")):
        with pytest.raises(ApiError) as refused:
            getattr(broker, lookup)(tenant, asked)
        assert refused.value.status_code == 404 and refused.value.param == param


def test_another_tenants_session_takes_no_models_samplers_or_heartbeats():
    broker = make_broker()
    session = broker.create_session("tenant-a", [], {})
    for attempt in (lambda: new_model(broker, "tenant-b", session_id=session.session_id),
                    lambda: broker.new_sampler("tenant-b", session.session_id, 1, BASE, None, None),
                    lambda: broker.heartbeat("tenant-b", session.session_id),
                    lambda: broker.finish("tenant-b", session.session_id)):
        with pytest.raises(ApiError) as refused:
            attempt()
        assert refused.value.status_code == 404
    assert not broker.models and not broker.samplers and not session.finished


# ---- results --------------------------------------------------------------------------------------------
def test_a_failed_result_fails_only_its_own_op():
    async def scenario() -> None:
        broker = make_broker()
        bad = submit(broker, new_model(broker, "tenant-a"), "forward_backward", 1, tokens=10)
        good = submit(broker, new_model(broker, "tenant-a"), "forward_backward", 1, tokens=10)
        lost = submit(broker, new_model(broker, "tenant-b"), "optim_step", 1)
        encoded = submit(broker, new_model(broker, "tenant-b"), "forward_backward", 1, tokens=10)
        pool = broker.pools[BASE]
        assert sorted(ids(broker.cycle(pool))) == sorted(ids([bad, good, lost, encoded]))

        results = [failed(bad, "token 99999 is out of the vocabulary", "user"), ok(good, loss=2.0),
                   failed(lost, "out of memory"), {"op_id": encoded.op_id, "ok": True, "proto": "AAEC"},
                   {"op_id": "req-unknown", "ok": True, "json": {}}]
        done = asyncio.create_task(broker.work(pool, results))
        await asyncio.sleep(0.01)
        broker.close()
        assert await asyncio.wait_for(done, 1.0) == []

        assert bad.future.error == "token 99999 is out of the vocabulary" and bad.future.category == "user"
        assert bad.future.body is None
        assert good.future.error is None and good.future.body == {"loss": 2.0}
        assert lost.future.error == "out of memory" and lost.future.category == "server"  # no category given
        assert encoded.future.body == b"\x00\x01\x02" and encoded.future.content_type == PROTO
        assert not pool.running

    run(scenario())


@pytest.mark.parametrize("raised, category, message", [
    (ApiError(400, "the checkpoint is of another base"), "user", "the checkpoint is of another base"),
    (RuntimeError("disk full"), "server", "could not be completed"),
    (None, "server", "produced no result"),
])
def test_an_after_step_that_fails_or_resolves_nothing_fails_the_future(raised: Exception | None, category: str,
                                                                      message: str):
    async def after(op: Op, result: dict[str, Any]) -> None:
        if raised is not None:
            raise raised

    async def scenario() -> None:
        broker = make_broker()
        op = submit(broker, new_model(broker, "tenant-a"), "save", 1, after=after)
        other = submit(broker, new_model(broker, "tenant-a"), "save", 1)
        pool = broker.pools[BASE]
        assert len(await work(broker, pool, [])) == 2
        broker.close()
        assert await work(broker, pool, [ok(op), ok(other)]) == []
        assert op.future.done.is_set() and op.future.category == category
        assert op.future.error is not None and message in op.future.error
        assert other.future.error is None and other.future.body == {"done": other.op_id}

    run(scenario())


def test_an_after_step_resolves_the_future_with_the_result():
    seen: list[dict[str, Any]] = []

    async def after(op: Op, result: dict[str, Any]) -> None:
        seen.append(result)
        op.future.resolve({"path": "tinker://run/weights/final"})

    async def scenario() -> None:
        broker = make_broker()
        op = submit(broker, new_model(broker, "tenant-a"), "save", 1, after=after)
        pool = broker.pools[BASE]
        assert await work(broker, pool, []) == [op]
        broker.close()
        await work(broker, pool, [ok(op, state="c3RhdGU=")])
        assert seen == [ok(op, state="c3RhdGU=")]
        assert op.future.body == {"path": "tinker://run/weights/final"} and op.future.error is None

    run(scenario())


# ---- a lost worker --------------------------------------------------------------------------------------
def test_a_lost_worker_fails_what_it_ran_and_what_waits_on_a_model_without_kept_state():
    launched: list[Pool] = []
    broker = make_broker(queued_per_tenant=8, launched=launched)
    session = broker.create_session("tenant-a", [], {})
    model = new_model(broker, "tenant-a", session_id=session.session_id)
    running = submit(broker, model, "forward_backward", 1, tokens=10)
    queued = submit(broker, model, "optim_step", 2)
    buffered = submit(broker, model, "save", 4)
    kept = new_model(broker, "tenant-a", model_seq_id=1)
    kept.state_key, kept.hosted = "states/tenant-a/kept", True
    kept_op = submit(broker, kept, "optim_step", 1)
    fresh = new_model(broker, "tenant-a", model_seq_id=2)
    elsewhere = submit(broker, new_model(broker, "tenant-a", base=OTHER_BASE), "create", None)
    pool = broker.pools[BASE]
    first = broker.cycle(pool)
    assert sorted(ids(first)) == sorted(ids([running, kept_op]))
    queued_again = submit(broker, kept, "save", 2)
    create = submit(broker, fresh, "create", None)
    sample = broker.op("tenant-a", "sample", None, {"prompt": [1]})
    broker.submit_to_pool(BASE, sample)  # the pool's own queue, not yet handed out
    with pytest.raises(ApiError):
        broker.op("tenant-a", "optim_step", model.model_id, {})  # 8 waiting or running (1 on another base)

    broker.worker_lost(pool, "exit code 137")

    for op in (running, kept_op, queued, buffered):
        assert op.future.done.is_set() and op.future.category == "server"
        assert op.future.error is not None and "exit code 137" in op.future.error
    assert not model.ready and not model.buffered and model.running is None and not model.hosted
    assert model.model_id in broker.models and session.models == [model.model_id]  # kept: its id stays valid
    assert list(kept.ready) == [queued_again] and not kept.hosted and kept.running is None
    assert list(fresh.ready) == [create]
    for op in (queued_again, create, sample, elsewhere):
        assert not op.future.done.is_set()
    for _ in range(4):  # the four failed ops no longer count against the tenant
        broker.op("tenant-a", "optim_step", None, {})

    replacement = broker.pools[BASE]  # work is waiting: the base gets a new worker
    assert replacement is not pool and [p.base for p in launched] == [BASE, OTHER_BASE, BASE]
    assert not pool.running
    second = broker.cycle(replacement)
    assert sorted(ids(second)) == sorted(ids([queued_again, create, sample]))
    assert queued_again.payload["restore_key"] == "states/tenant-a/kept"  # loaded first, from its kept state
    assert "restore_key" not in create.payload


def test_a_lost_worker_with_nothing_waiting_is_not_replaced():
    launched: list[Pool] = []
    broker = make_broker(launched=launched)
    model = new_model(broker, "tenant-a")
    op = submit(broker, model, "create", None)
    pool = broker.pools[BASE]
    assert broker.cycle(pool) == [op]
    broker.worker_lost(pool, "exit code 1")
    assert op.future.category == "server" and BASE not in broker.pools and launched == [pool]

    step = submit(broker, model, "optim_step", 1)  # the next request starts one
    assert len(launched) == 2 and broker.cycle(broker.pools[BASE]) == [step]


def test_a_lost_worker_is_not_replaced_once_the_broker_closes():
    launched: list[Pool] = []
    broker = make_broker(launched=launched)
    model = new_model(broker, "tenant-a")
    submit(broker, model, "create", None)
    pool = broker.pools[BASE]
    broker.cycle(pool)
    submit(broker, model, "optim_step", 1)
    broker.close()
    broker.worker_lost(pool, "stopped")
    assert BASE not in broker.pools and launched == [pool]


def test_a_lost_worker_does_not_resume_a_model_from_a_state_older_than_its_last_steps(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 0.0)  # an empty request for work answers at once

    async def scenario() -> None:
        broker = make_broker()
        model = new_model(broker, "tenant-a")
        model.state_key = "states/tenant-a/idle"  # kept when it was released idle, then used again
        step = submit(broker, model, "optim_step", 1)
        pool = broker.pools[BASE]
        assert await work(broker, pool, []) == [step]
        assert step.payload["restore_key"] == "states/tenant-a/idle"
        assert await work(broker, pool, [{**ok(step), "hosted": True}]) == []
        assert model.hosted
        following = submit(broker, model, "forward_backward", 2, tokens=10)
        assert await work(broker, pool, []) == [following]
        waiting = submit(broker, model, "optim_step", 3)

        broker.worker_lost(pool, "killed")  # no state sent back: the one kept is older than seq 1-2
        assert waiting.future.done.is_set() and waiting.future.category == "server"

    run(scenario())


# ---- idle models and pools ------------------------------------------------------------------------------
def test_idle_hosted_models_are_released_and_an_idle_pool_is_stopped(clock: Clock, monkeypatch: pytest.MonkeyPatch):
    clock.now = 10_000_000.0  # later than any real monotonic time a pool was made at
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 0.0)  # an empty request for work answers at once

    async def scenario() -> None:
        broker = make_broker(queued_per_tenant=1)
        idle = new_model(broker, "tenant-a")
        create = submit(broker, idle, "create", None)
        cold = new_model(broker, "tenant-a")  # never hosted: nothing to release
        pool = broker.pools[BASE]
        assert await work(broker, pool, []) == [create]
        assert await work(broker, pool, [{**ok(create), "hosted": True}]) == []
        assert idle.hosted and not cold.hosted

        clock.now += 59.0
        assert broker.release_idle(60.0) == [] and not pool.stop
        clock.now += 1.0
        released = broker.release_idle(60.0)
        assert [(op.kind, op.model) for op in released] == [("release", idle.model_id)]
        assert list(idle.ready) == released and released[0].op_id not in broker.futures
        assert broker.release_idle(60.0) == []  # one release at a time
        broker.op("tenant-a", "optim_step", None, {})  # a release is not the tenant's request

        assert broker.cycle(pool) == released and not pool.stop
        clock.now += 30.0
        broker.release_idle(1.0)
        assert not pool.stop  # its release is still running

        async def after(op: Op, result: dict[str, Any]) -> None:
            op.future.resolve({})

        released[0].after = after
        assert await work(broker, pool, [{**ok(released[0]), "hosted": False}]) == []
        assert not idle.hosted and released[0].future.done.is_set()

        clock.now += 29.0  # 59 s since its last cycle
        broker.release_idle(60.0)
        assert not pool.stop
        clock.now += 1.0
        broker.release_idle(60.0)
        assert pool.stop
        assert await asyncio.wait_for(broker.next_cycle(pool), 1.0) == []

    run(scenario())


def test_an_op_of_a_model_the_worker_does_not_hold_carries_its_kept_state():
    broker = make_broker()
    away = new_model(broker, "tenant-a")
    away.state_key = "states/tenant-a/away"
    held = new_model(broker, "tenant-a")
    held.state_key, held.hosted = "states/tenant-a/held", True
    reloaded = new_model(broker, "tenant-a")
    reloaded.state_key = "states/tenant-a/reloaded"
    away_op = submit(broker, away, "forward_backward", 1, tokens=10)
    held_op = submit(broker, held, "optim_step", 1)
    load = submit(broker, reloaded, "load", 1)
    broker.cycle(broker.pools[BASE])
    assert away_op.payload["restore_key"] == "states/tenant-a/away"
    assert "restore_key" not in held_op.payload and "restore_key" not in load.payload


# ---- waits ----------------------------------------------------------------------------------------------
def test_wait_times_out_false_and_returns_true_once_resolved():
    async def scenario() -> None:
        broker = make_broker()
        op = submit(broker, new_model(broker, "tenant-a"), "create", None)
        started = time.monotonic()
        assert await broker.wait(op.future, 0.05) is False
        assert 0.04 <= time.monotonic() - started < 1.0

        asyncio.get_running_loop().call_later(0.02, op.future.resolve, {"model_id": "m"})
        started = time.monotonic()
        assert await broker.wait(op.future, 2.0) is True
        assert time.monotonic() - started < 1.0 and op.future.body == {"model_id": "m"}
        assert await broker.wait(op.future, 0.0) is True  # already resolved

        failing = submit(broker, new_model(broker, "tenant-a"), "create", None)
        asyncio.get_running_loop().call_later(0.01, failing.future.fail, "no room", "server")
        assert await broker.wait(failing.future, 2.0) is True and failing.future.error == "no room"

    run(scenario())


def test_work_with_nothing_ready_answers_empty_after_its_wait(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 0.1)

    async def scenario() -> None:
        broker = make_broker()
        op = submit(broker, new_model(broker, "tenant-a"), "create", None)
        pool = broker.pools[BASE]
        assert await work(broker, pool, []) == [op]
        started = time.monotonic()
        assert await work(broker, pool, []) == []  # the model's one op is still running
        assert 0.09 <= time.monotonic() - started < 1.0
        assert pool.last_seen > 0

    run(scenario())


def test_a_held_request_for_work_takes_an_op_submitted_meanwhile(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 10.0)

    async def scenario() -> None:
        broker = make_broker()
        model = new_model(broker, "tenant-a")
        first = submit(broker, model, "create", None)
        pool = broker.pools[BASE]
        assert await work(broker, pool, []) == [first]
        held = asyncio.create_task(broker.work(pool, [ok(first)]))
        await asyncio.sleep(0.02)
        assert not held.done()
        second = submit(broker, model, "optim_step", 1)
        assert await asyncio.wait_for(held, 1.0) == [second]

    run(scenario())


def test_close_ends_a_held_request_for_work_at_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(broker_module, "WORK_WAIT_S", 30.0)

    async def scenario() -> None:
        broker = make_broker()
        op = submit(broker, new_model(broker, "tenant-a"), "create", None)
        pool = broker.pools[BASE]
        assert await work(broker, pool, []) == [op]
        held = asyncio.create_task(broker.work(pool, []))
        await asyncio.sleep(0.02)
        assert not held.done()
        broker.close()
        assert await asyncio.wait_for(held, 1.0) == []
        assert broker.closed

        ready = submit(broker, new_model(broker, "tenant-a"), "create", None)
        started = time.monotonic()
        assert await work(broker, pool, [ok(op)]) == []  # stopping: no new cycle
        assert time.monotonic() - started < 0.5
        assert op.future.body == {"done": op.op_id} and not ready.future.done.is_set()

    run(scenario())


# ---- sessions -------------------------------------------------------------------------------------------
def test_heartbeats_keep_a_session_until_it_finishes(clock: Clock):
    broker = make_broker()
    session = broker.create_session("tenant-a", ["exp"], {"owner": "ml"})
    assert session.last_seen == clock.now and session.tags == ["exp"]
    clock.now += 10.0
    broker.heartbeat("tenant-a", session.session_id)
    assert session.last_seen == clock.now

    broker.finish("tenant-a", session.session_id)
    for attempt in (lambda: broker.heartbeat("tenant-a", session.session_id),
                    lambda: new_model(broker, "tenant-a", session_id=session.session_id)):
        with pytest.raises(ApiError) as finished:
            attempt()
        assert finished.value.status_code == 410 and finished.value.code == "session_finished"
    assert broker.session("tenant-a", session.session_id).finished


def test_finished_futures_are_forgotten_after_their_ttl(clock: Clock):
    async def scenario() -> None:
        broker = make_broker()
        old = submit(broker, new_model(broker, "tenant-a"), "create", None)
        fresh = submit(broker, new_model(broker, "tenant-a"), "create", None)
        old.future.resolve({})
        clock.now += broker_module.RESULT_TTL_S - 1.0
        fresh.future.resolve({})
        clock.now += 2.0
        broker.create_session("tenant-a", [], {})
        assert old.op_id not in broker.futures and fresh.op_id in broker.futures

    run(scenario())


def test_the_limits_are_the_callers_tiers() -> None:
    async def scenario() -> None:
        broker = Broker(cycle_tokens=1500, models_per_tenant={"free": 1, "premium": 3},
                        queued_per_tenant={"free": 2, "premium": 5}, launch=lambda pool: None)
        broker.tiers.update({"poor": "free", "rich": "premium"})
        new_model(broker, "poor")
        with pytest.raises(ApiError) as refused:
            new_model(broker, "poor", model_seq_id=1)
        assert refused.value.status_code == 429 and refused.value.retry_after
        rich = [new_model(broker, "rich", model_seq_id=index) for index in range(3)]
        with pytest.raises(ApiError):
            new_model(broker, "rich", model_seq_id=3)
        for _ in range(5):
            broker.op("rich", "optim_step", rich[0].model_id, {})
        with pytest.raises(ApiError) as queued:
            broker.op("rich", "optim_step", rich[0].model_id, {})
        assert queued.value.status_code == 429 and "5 training-API requests" in queued.value.message
        broker.tiers["unknown-tier-tenant"] = "enterprise"  # a tier the limits do not name: the free one's
        broker.op("unknown-tier-tenant", "optim_step", None, {})
        broker.op("unknown-tier-tenant", "optim_step", None, {})
        with pytest.raises(ApiError):
            broker.op("unknown-tier-tenant", "optim_step", None, {})

    run(scenario())


def test_a_tenant_holds_a_bounded_number_of_sessions_and_of_samplers_of_its_own_weights(monkeypatch) -> None:
    from tuneforge.services.training_api import broker as broker_module

    async def scenario() -> None:
        monkeypatch.setattr(broker_module, "SESSIONS_PER_TENANT", 2)
        monkeypatch.setattr(broker_module, "SAMPLERS_PER_TENANT", 2)
        broker = make_broker()
        first = broker.create_session("acme", [], {})
        broker.create_session("acme", [], {})
        with pytest.raises(ApiError) as refused:
            broker.create_session("acme", [], {})
        assert refused.value.status_code == 429 and refused.value.code == "too_many_sessions"
        broker.create_session("other", [], {})  # another tenant is not counted
        broker.finish("acme", first.session_id)
        session = broker.create_session("acme", [], {})  # a finished session gives its place back

        samplers = [broker.new_sampler("acme", session.session_id, index, BASE, None, None) for index in range(3)]
        for sampler in samplers:
            broker.hold_sampler(sampler)
        assert [s.retired for s in samplers] == [True, False, False]  # the oldest let its weights go
        (pool,) = broker.pools.values()
        assert [(op.kind, op.model) for op in pool.ops] == [("drop", samplers[0].sampler_id)]

    run(scenario())


def sample_op(broker: Broker, tenant: str, session_id: str) -> Op:
    sampler = broker.new_sampler(tenant, session_id, len(broker.samplers), BASE, None, None)
    op = broker.op(tenant, "sample", sampler.hosted_as, {"prompt": [1, 2]})
    op.session_id = session_id
    broker.submit_to_pool(BASE, op)
    return op


def test_a_waiting_sample_is_cancelled_by_its_client_and_no_cycle_takes_it():
    async def scenario() -> None:
        broker = make_broker(queued_per_tenant=2)
        session = broker.create_session("acme", [], {}).session_id
        first, second = sample_op(broker, "acme", session), sample_op(broker, "acme", session)
        with pytest.raises(ApiError) as full:  # both wait: the tenant is at its limit
            broker.op("acme", "sample", None, {})
        assert full.value.status_code == 429
        for stranger in (lambda: broker.cancel("globex", second.op_id), lambda: broker.cancel("acme", "req-nope")):
            with pytest.raises(ApiError) as unknown:
                stranger()
            assert unknown.value.status_code == 404
        assert broker.cancel("acme", second.op_id) is True
        assert second.future.error == "cancelled by the client" and second.future.category == "user"
        broker.op("acme", "sample", None, {})  # its place in the tenant's queue is free again
        (pool,) = broker.pools.values()
        taken = await work(broker, pool)
        assert first.op_id in ids(taken) and second.op_id not in ids(taken)
        assert broker.cancel("acme", first.op_id) is False  # a cycle took it: it runs to its end
        assert not first.future.done.is_set()
        await broker.report(pool, [{"op_id": first.op_id, "ok": True, "json": {"samples": 1}}])
        assert first.future.body == {"samples": 1}

        model = new_model(broker, "acme")
        fb = submit(broker, model, "forward_backward", 1)
        with pytest.raises(ApiError) as training:  # a training op is part of its model's sequence
            broker.cancel("acme", fb.op_id)
        assert training.value.status_code == 400 and training.value.param == "request_id"

    run(scenario())


def test_a_session_whose_client_stopped_beating_has_its_waiting_requests_dropped(clock: Clock):
    async def scenario() -> None:
        broker = make_broker()
        gone = broker.create_session("acme", [], {}).session_id
        alive = broker.create_session("acme", [], {}).session_id
        model, other = new_model(broker, "acme", session_id=gone), new_model(broker, "acme", session_id=alive)
        (pool,) = (broker._pool(BASE),)
        running = submit(broker, model, "forward_backward", 1, tokens=10)
        taken = await work(broker, pool)
        assert ids(taken) == [running.op_id]
        waiting = [submit(broker, model, "optim_step", 2), submit(broker, model, "forward_backward", 4)]  # 4: buffered
        lost_sample, kept_sample = sample_op(broker, "acme", gone), sample_op(broker, "acme", alive)
        kept = submit(broker, other, "forward_backward", 1)

        clock.now += broker_module.SESSION_GONE_S - 1.0
        broker.heartbeat("acme", alive)
        assert broker.drop_lapsed() == 0
        clock.now += 2.0  # `gone` has been silent for SESSION_GONE_S + 1, `alive` beat 2 s ago
        assert broker.drop_lapsed() == 3
        for op in (*waiting, lost_sample):
            assert op.future.category == "user" and "no heartbeat" in op.future.error
        assert not running.future.done.is_set()  # what a cycle took finishes
        assert not kept.future.done.is_set() and not kept_sample.future.done.is_set()
        assert broker._queued["acme"] == 3  # running, kept, kept_sample
        taken = await work(broker, pool, [ok(running)])
        assert running.future.body == {"done": running.op_id}
        assert set(ids(taken)) == {kept.op_id, kept_sample.op_id}
        # the client comes back: its session goes on, its next requests run
        broker.heartbeat("acme", gone)
        again = submit(broker, model, "forward_backward", 5)  # after the dropped ones' gap
        clock.now += broker_module.GAP_S
        assert again.op_id in ids(broker.cycle(pool))

    run(scenario())


def test_a_scheduled_pools_new_attempt_takes_over_and_what_the_old_one_held_fails_or_goes_back():
    async def scenario() -> None:
        broker = make_broker()
        model, other = new_model(broker, "acme"), new_model(broker, "globex")
        pool = broker._pool(BASE)
        broker.attempt_started(pool, 1)
        first = submit(broker, model, "forward_backward", 1)
        lost = submit(broker, other, "forward_backward", 1)
        assert set(ids(await work(broker, pool))) == {first.op_id, lost.op_id}
        broker.models[model.model_id].hosted = broker.models[other.model_id].hosted = True
        broker.models[model.model_id].state_key = "kept/acme"  # one model's state was kept, the other's not
        waiting = submit(broker, other, "optim_step", 2)

        # the attempt crashed and the scheduler started attempt 2 at once: its first request fails what
        # attempt 1 was running; the model without kept state cannot go on
        broker.attempt_started(pool, 2)
        assert "attempt 1 of its job ended" in first.future.error and first.future.category == "server"
        assert lost.future.error and "load it from a checkpoint" in waiting.future.error
        assert pool.running == {} and not broker.models[model.model_id].hosted
        assert broker.pools[BASE] is pool  # the same pool, served by its job's new attempt
        broker.attempt_started(pool, 2)  # (every request of it says so: nothing more happens)

        # attempt 2 ends and the job waits for GPUs again: what it ran fails once, its ops wait
        again = submit(broker, model, "forward_backward", 2)
        assert ids(await work(broker, pool)) == [again.op_id]
        broker.attempt_ended(pool, 1, "stale news of an earlier attempt")  # not the serving one: ignored
        assert not again.future.done.is_set()
        broker.attempt_ended(pool, 2, "preempted")
        assert again.future.error and pool.attempt == 0
        later = submit(broker, model, "forward_backward", 3)
        broker.attempt_started(pool, 3)
        assert ids(await work(broker, pool)) == [later.op_id]  # restored from the kept state
        assert later.payload.get("restore_key") == "kept/acme"

    run(scenario())


def test_a_handed_back_pool_puts_what_an_abandoned_request_took_back_in_line_and_that_request_takes_no_more(
        monkeypatch: pytest.MonkeyPatch):
    async def scenario() -> None:
        monkeypatch.setattr(broker_module, "WORK_WAIT_S", 0.5)
        broker = make_broker()
        model = new_model(broker, "acme")
        session = broker.sessions[model.session_id].session_id
        pool = broker._pool(BASE)
        held = asyncio.create_task(broker.next_cycle(pool))  # the worker's request for work, held
        await asyncio.sleep(0)
        taken = submit(broker, model, "forward_backward", 1)
        sample = sample_op(broker, "acme", session)
        assert set(ids(await asyncio.wait_for(held, 2.0))) == {taken.op_id, sample.op_id}
        stale = asyncio.create_task(broker.next_cycle(pool))  # another request of that worker, held
        await asyncio.sleep(0)
        # ...but the worker had given those requests up (SIGTERM) and hands back without their results
        broker.handed_back(pool)
        assert pool.running == {} and not taken.future.done.is_set() and not sample.future.done.is_set()
        assert [op.op_id for op in broker.models[model.model_id].ready] == [taken.op_id]
        assert [op.op_id for op in pool.ops] == [sample.op_id]
        assert await asyncio.wait_for(stale, 2.0) == []  # the held one takes nothing back out
        assert set(ids(await work(broker, pool))) == {taken.op_id, sample.op_id}  # the next worker runs them

    run(scenario())


def test_an_idle_pool_is_retired_once_through_the_hook_and_stops_when_it_says_so(clock: Clock):
    retired: list = []
    broker = Broker(cycle_tokens=1500, models_per_tenant=16, queued_per_tenant=64, launch=lambda pool: None,
                    retire=retired.append)
    pool = broker._pool(BASE)
    pool.last_busy = clock.now
    clock.now += 10.0
    broker.release_idle(5.0)
    broker.release_idle(5.0)
    assert retired == [pool] and not pool.stop  # the hook decides when the worker is told (a scheduled
    broker_module.stop_now(pool)  # pool's job is cancelled first)
    assert pool.stop and pool.wake.is_set()
