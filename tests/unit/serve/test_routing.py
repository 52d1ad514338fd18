"""A route's versions by weight: 10,000 requests split within 2 points of the weights, with or
without users; a user never switches version while the weights stay; a weight change moves
only the users whose interval moved."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tuneforge.serve.routing import Version, pick

VERSIONS = [Version("ft:base:acme::a", 90), Version("ft:base:acme::b", 10)]
REQUESTS = 10_000


def _shares(counts: Counter) -> dict[str, float]:
    return {model: counts[model] / sum(counts.values()) for model in counts}


def test_requests_without_a_user_split_by_weight():
    rng = random.Random(7)
    counts = Counter(pick("route-1", VERSIONS, rng=rng).model for _ in range(REQUESTS))
    shares = _shares(counts)
    assert abs(shares["ft:base:acme::a"] - 0.9) <= 0.02 and abs(shares["ft:base:acme::b"] - 0.1) <= 0.02
    three = [Version("x", 50), Version("y", 30), Version("z", 20)]
    shares = _shares(Counter(pick("route-2", three, rng=rng).model for _ in range(REQUESTS)))
    assert all(abs(shares[v.model] - v.weight / 100) <= 0.02 for v in three)


def test_users_split_by_weight_and_never_switch():
    users = [f"user-{number}" for number in range(REQUESTS)]
    first = {user: pick("route-1", VERSIONS, user).model for user in users}
    shares = _shares(Counter(first.values()))
    assert abs(shares["ft:base:acme::b"] - 0.1) <= 0.02
    for _ in range(3):  # the same users again, in another order
        for user in random.Random(1).sample(users, len(users)):
            assert pick("route-1", VERSIONS, user).model == first[user]
    # another route splits the same users independently
    other = {user: pick("route-9", VERSIONS, user).model for user in users}
    assert other != first


def test_a_weight_change_moves_only_the_users_whose_interval_moved():
    users = [f"user-{number}" for number in range(REQUESTS)]
    before = {user: pick("route-1", VERSIONS, user).model for user in users}
    after = {user: pick("route-1", [Version("ft:base:acme::a", 80), Version("ft:base:acme::b", 20)], user).model
             for user in users}
    moved = [user for user in users if before[user] != after[user]]
    assert all(before[user] == "ft:base:acme::a" and after[user] == "ft:base:acme::b" for user in moved)
    assert abs(len(moved) / REQUESTS - 0.1) <= 0.02  # the 10% between 80 and 90


def test_a_zero_weight_version_takes_nothing_and_no_weight_at_all_is_refused():
    rng = random.Random(3)
    silent = [Version("a", 100), Version("b", 0)]
    assert {pick("r", silent, rng=rng).model for _ in range(1000)} == {"a"}
    assert {pick("r", silent, f"u{n}").model for n in range(1000)} == {"a"}
    with pytest.raises(ValueError):
        pick("r", [Version("a", 0)])
