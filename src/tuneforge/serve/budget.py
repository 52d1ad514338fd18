"""Generation work in flight per tenant: the sum, over a tenant's queued and running requests on
this process's engine, of n × max_tokens.

A request reserves its whole work at once (`TokenBudget.reserve`: all its choices or none, checked
and counted under one lock, so two threads of the same API process cannot both pass the check) and
gets a `Lease`. Each choice submitted under the lease holds it; the tokens come back when the
lease is closed (no more choices will be submitted) and every choice has left the batch (finished,
cancelled or failed: the batcher says so). A stream whose reader never started still holds its
tokens until its choices end, as its rows still cost the batch.

Tokens are counted as asked (n × max_tokens), not as generated: `ignore_eos` and `min_tokens` run
a row to that length at most, so neither can exceed what was reserved. The budget lives in the
engine, one per API process: with W workers a tenant may hold up to W times its bound in all.
No torch here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tuneforge.domain.errors import invalid, rate_limited

OVER_BUDGET_CODE = "max_tokens_over_budget"  # 400: one request asks more than the tenant may ever hold
IN_FLIGHT_CODE = "tokens_in_flight_exceeded"  # 429: the tenant's earlier requests hold the rest


class TokenBudget:
    """Tokens each tenant has reserved on this engine (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held_tokens: dict[str, int] = {}

    def reserve(self, tenant: str, tokens: int, limit_tokens: int | None, *, retry_after_s: float = 1.0,
                param: str = "max_tokens") -> Lease:
        """A lease of `tokens` for `tenant`; None for `limit_tokens` counts without a bound.

        Raises 400 when `tokens` alone is over the limit (waiting would not help) and 429 with
        Retry-After when the tenant's other requests hold too much of it."""
        if limit_tokens is not None and tokens > limit_tokens:
            raise invalid(f"This request asks for {tokens} tokens of generation (n × {param}); at most "
                          f"{limit_tokens} may be in flight for this tenant: ask for fewer tokens or choices",
                          param=param, code=OVER_BUDGET_CODE)
        with self._lock:
            held = self._held_tokens.get(tenant, 0)
            if limit_tokens is not None and held + tokens > limit_tokens:
                raise rate_limited(f"This tenant's requests have {held} tokens of generation in flight; this one "
                                   f"asks for {tokens} more and at most {limit_tokens} may be: retry shortly",
                                   code=IN_FLIGHT_CODE, retry_after=max(1.0, retry_after_s))
            self._held_tokens[tenant] = held + tokens
        return Lease(self, tenant, tokens)

    def held_tokens(self, tenant: str) -> int:
        with self._lock:
            return self._held_tokens.get(tenant, 0)

    def _take_again(self, tenant: str, tokens: int) -> None:
        # work already admitted, back under a lease that had been settled: counted, never refused
        with self._lock:
            self._held_tokens[tenant] = self._held_tokens.get(tenant, 0) + tokens

    def _give_back(self, tenant: str, tokens: int) -> None:
        with self._lock:
            left = self._held_tokens.get(tenant, 0) - tokens
            if left > 0:
                self._held_tokens[tenant] = left
            else:
                self._held_tokens.pop(tenant, None)  # no entry per tenant that ever asked


class Lease:
    """One request's reserved tokens: given back once closed and no choice holds it any more.

    `with lease:` closes it at the end of the block (the request submitted all it will)."""

    def __init__(self, budget: TokenBudget, tenant: str, tokens: int) -> None:
        self.tenant = tenant
        self.tokens = tokens
        self._budget = budget
        self._lock = threading.Lock()
        self._holders = 0
        self._open = True
        self._returned = False

    def hold(self) -> Callable[[], None]:
        """A choice runs under the lease; call the returned function (once) when it has ended.

        A choice that comes after the lease was settled (a straggler of a request that failed
        part-way, still submitting) takes its tokens back into the count: what runs is counted."""
        with self._lock:  # the budget's counts change under this lease's lock: never out of order
            self._holders += 1
            if self._returned:
                self._returned = False
                self._budget._take_again(self.tenant, self.tokens)
        released = [False]  # this choice's own flag: a second call changes nothing

        def let_go() -> None:
            with self._lock:
                if released[0]:
                    return
                released[0] = True
                self._holders -= 1
            self._settle()

        return let_go

    def close(self) -> None:
        """No more choices will be submitted under this lease."""
        with self._lock:
            self._open = False
        self._settle()

    @property
    def returned(self) -> bool:
        return self._returned

    def _settle(self) -> None:
        with self._lock:
            if self._open or self._holders or self._returned:
                return
            self._returned = True
            self._budget._give_back(self.tenant, self.tokens)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
