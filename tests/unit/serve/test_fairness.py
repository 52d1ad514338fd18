"""The admission policy of a shared batch as counts: the fair share, which waiting tenant gets the
next free row, and which running rows are set aside for tenants waiting within their share."""

from __future__ import annotations

from collections import OrderedDict

from tuneforge.serve.fairness import fair_share_rows, next_tenant, rows_to_preempt


def test_the_fair_share_is_an_equal_split_and_at_least_one_row():
    assert [fair_share_rows(16, tenants) for tenants in (0, 1, 2, 3, 16, 40)] == [16, 16, 8, 5, 1, 1]
    assert fair_share_rows(1, 2) == 1


def test_a_free_row_goes_to_the_tenant_holding_the_fewest_rows_in_round_robin_order_among_equals():
    order = OrderedDict.fromkeys(["acme", "globex", "initech"])
    assert next_tenant(order, {"acme": 15, "globex": 0, "initech": 0}) == "globex"
    assert next_tenant(order, {"acme": 2, "globex": 3, "initech": 1}) == "initech"
    assert next_tenant(order, {}) == "acme"  # equals: the round-robin's first
    assert next_tenant([], {"acme": 1}) is None


def test_nothing_is_set_aside_while_the_batch_has_room_or_nobody_else_waits():
    assert rows_to_preempt({"acme": 16}, {}, 16) == {}  # alone: every row
    assert rows_to_preempt({"acme": 16}, {"acme": 30}, 16) == {}  # its own queue takes no rows from it
    assert rows_to_preempt({"acme": 12}, {"globex": 3}, 16) == {}  # 4 free rows cover globex
    assert rows_to_preempt({}, {"acme": 5, "globex": 5}, 16) == {}


def test_a_tenant_over_its_share_gives_back_only_the_rows_the_waiting_ones_need():
    assert rows_to_preempt({"acme": 16}, {"globex": 1}, 16) == {"acme": 1}
    assert rows_to_preempt({"acme": 15}, {"globex": 3}, 16) == {"acme": 2}  # one row was free
    # globex's share is 8: its ninth waiting request waits for a free row
    assert rows_to_preempt({"acme": 16}, {"globex": 20}, 16) == {"acme": 8}


def test_a_tenant_at_or_under_its_share_is_never_preempted():
    assert rows_to_preempt({"acme": 8, "globex": 8}, {"globex": 4}, 16) == {}
    # a third tenant arrives: shares are 5 each; the heaviest give back what it needs
    assert rows_to_preempt({"acme": 8, "globex": 8}, {"initech": 1}, 16) == {"acme": 1}
    assert rows_to_preempt({"acme": 9, "globex": 7}, {"initech": 4}, 16) == {"acme": 3, "globex": 1}
    assert rows_to_preempt({"acme": 1}, {"globex": 1}, 1) == {}  # one row: nobody is over a share of one


def test_set_aside_rows_waiting_again_do_not_set_aside_more():
    # acme (16 rows) gave one to globex; its set-aside row now waits: nothing moves again
    assert rows_to_preempt({"acme": 15, "globex": 1}, {"acme": 1}, 16) == {}
