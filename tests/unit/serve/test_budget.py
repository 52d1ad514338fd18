"""Tokens of generation in flight per tenant: a request reserves n × max_tokens at once or is
refused (429 with Retry-After when others hold the rest, 400 when it never could fit); the tokens
come back only once the lease is closed and every choice under it has ended; tenants do not
share a bound; concurrent reservations never pass it together."""

from __future__ import annotations

import threading

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.serve.budget import IN_FLIGHT_CODE, OVER_BUDGET_CODE, TokenBudget

LIMIT_TOKENS = 4096


def test_a_request_reserves_all_its_choices_or_none():
    budget = TokenBudget()
    first = budget.reserve("acme", 8 * 256, LIMIT_TOKENS)
    second = budget.reserve("acme", 8 * 256, LIMIT_TOKENS)
    assert budget.held_tokens("acme") == 4096
    with pytest.raises(ApiError) as refused:
        budget.reserve("acme", 1, LIMIT_TOKENS, retry_after_s=2.5)
    error = refused.value
    assert (error.status_code, error.code, error.type, error.retry_after) == (429, IN_FLIGHT_CODE,
                                                                              "rate_limit_error", 2.5)
    assert "4096 tokens of generation in flight" in error.message
    assert budget.held_tokens("acme") == 4096  # a refusal holds nothing
    first.close()
    second.close()
    assert budget.held_tokens("acme") == 0


def test_a_request_larger_than_the_whole_bound_answers_400_naming_the_field():
    budget = TokenBudget()
    with pytest.raises(ApiError) as refused:
        budget.reserve("acme", LIMIT_TOKENS + 1, LIMIT_TOKENS, param="max_completion_tokens")
    error = refused.value
    assert (error.status_code, error.code, error.param) == (400, OVER_BUDGET_CODE, "max_completion_tokens")
    assert "4097 tokens" in error.message and "at most 4096" in error.message
    assert budget.held_tokens("acme") == 0


def test_retry_after_is_at_least_a_second():
    budget = TokenBudget()
    budget.reserve("acme", LIMIT_TOKENS, LIMIT_TOKENS)
    with pytest.raises(ApiError) as refused:
        budget.reserve("acme", 1, LIMIT_TOKENS, retry_after_s=0.01)
    assert refused.value.retry_after == 1.0


def test_tenants_have_bounds_of_their_own_and_none_means_unbounded():
    budget = TokenBudget()
    budget.reserve("acme", LIMIT_TOKENS, LIMIT_TOKENS)
    budget.reserve("globex", LIMIT_TOKENS, LIMIT_TOKENS)  # acme's full bound leaves globex's whole
    unbounded = budget.reserve("initech", 10 * LIMIT_TOKENS, None)
    assert (budget.held_tokens("acme"), budget.held_tokens("globex"), budget.held_tokens("initech")) == (
        4096, 4096, 40960)
    unbounded.close()
    assert budget.held_tokens("initech") == 0


def test_tokens_come_back_once_closed_and_every_choice_has_ended():
    budget = TokenBudget()
    lease = budget.reserve("acme", 3 * 100, LIMIT_TOKENS)
    ends = [lease.hold() for _ in range(3)]
    lease.close()  # submitted all it will; the choices still run
    assert budget.held_tokens("acme") == 300 and not lease.returned
    ends[0]()
    ends[0]()  # a second call changes nothing
    ends[1]()
    assert budget.held_tokens("acme") == 300
    ends[2]()
    assert budget.held_tokens("acme") == 0 and lease.returned
    lease.close()  # closing twice gives nothing back twice
    assert budget.held_tokens("acme") == 0


def test_a_choice_that_ends_before_the_lease_closes_keeps_the_tokens_held():
    budget = TokenBudget()
    with budget.reserve("acme", 200, LIMIT_TOKENS) as lease:
        lease.hold()()  # the first choice already ended; a second may still come (a retry)
        assert budget.held_tokens("acme") == 200
    assert budget.held_tokens("acme") == 0


def test_a_straggler_after_the_lease_settled_is_counted_again():
    budget = TokenBudget()
    with budget.reserve("acme", 500, LIMIT_TOKENS) as lease:
        pass
    assert budget.held_tokens("acme") == 0
    late = lease.hold()  # a choice of a request that failed part-way, still submitting
    assert budget.held_tokens("acme") == 500
    late()
    assert budget.held_tokens("acme") == 0


def test_concurrent_reservations_never_pass_the_bound_together():
    budget = TokenBudget()
    granted, refused = [], []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait()
        try:
            lease = budget.reserve("acme", 1000, LIMIT_TOKENS)
        except ApiError:
            with lock:
                refused.append(1)
            return
        with lock:
            granted.append(lease)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(granted), len(refused)) == (4, 12)
    assert budget.held_tokens("acme") == 4000
