"""Who gets the rows of a shared batch: the admission policy of `serve/batching.py`, as plain
functions of counts (no torch, no threads), so the rules are tested on their own.

- **Fair share.** While tenants compete (rows running or requests waiting), each is entitled to
  `max_batch // tenants` rows, at least one.
- **Admission.** A free row goes to the waiting tenant that holds the fewest rows; among equals,
  to the one first in round-robin order. A tenant alone takes every free row (nothing is left
  idle).
- **Preemption.** When other tenants wait within their share and the batch has no room for
  them, a tenant holding more than its share has rows set aside (their tokens kept; they resume
  later by recomputing their cache) until the waiting ones fit or it is down to its share.
  Nothing running is killed, and a tenant at or under its share is never preempted.

So a tenant that fills the batch alone gives a row back the moment another tenant asks: that
tenant's first token waits one step, a set-aside and its own prefill, not for a whole row to end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def fair_share_rows(max_batch: int, tenants: int) -> int:
    """Rows one of `tenants` competing tenants is entitled to: an equal split, at least one."""
    return max(1, max_batch // max(1, tenants))


def next_tenant(waiting_order: Iterable[str], held_rows: Mapping[str, int]) -> str | None:
    """The waiting tenant that gets the next free row: the fewest rows held (running, or admitted
    at this step), the first in `waiting_order` (the round-robin) among equals."""
    chosen, fewest = None, 0
    for tenant in waiting_order:
        held = held_rows.get(tenant, 0)
        if chosen is None or held < fewest:
            chosen, fewest = tenant, held
    return chosen


def rows_to_preempt(held_rows: Mapping[str, int], waiting: Mapping[str, int], max_batch: int) -> dict[str, int]:
    """How many running rows of which tenants to set aside so that the waiting tenants get rows
    up to their fair share (see the module's docstring); {} when nothing must move.

    `held_rows`: rows each tenant runs; `waiting`: requests each tenant has waiting."""
    tenants = {tenant for tenant, rows in held_rows.items() if rows > 0} | {
        tenant for tenant, count in waiting.items() if count > 0}
    share = fair_share_rows(max_batch, len(tenants))
    wanted = sum(min(count, max(0, share - held_rows.get(tenant, 0))) for tenant, count in waiting.items())
    missing = wanted - (max_batch - sum(held_rows.values()))
    held = dict(held_rows)
    preempted: dict[str, int] = {}
    while missing > 0:
        heaviest = max(held, key=lambda tenant: held[tenant], default=None)
        if heaviest is None or held[heaviest] <= share:
            break
        held[heaviest] -= 1
        preempted[heaviest] = preempted.get(heaviest, 0) + 1
        missing -= 1
    return preempted
