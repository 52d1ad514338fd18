"""Capacity pools: which pools a job may run on now, cheapest first (pure functions).

The inventory's nodes belong to pools (`TUNEFORGE_CAPACITY_POOLS`): each has a kind (`spot`,
`on_demand` or `reserved`), a price per GPU-hour and, for spot, a preemption rate (reclaims per
node-hour, as observed or as the provider publishes it). A job asks for `resources.capacity`:

- `on_demand`: on-demand or reserved pools only;
- `spot`: spot pools only, preempted as often as they are, never moved (the tenant chose it);
- `auto` (the default for its tier): spot while it can still meet the job's deadline, else
  on-demand. It leaves spot after `spot_max_preemptions` reclaims more than its size and length
  make expected there, and when the time left is too short for spot's expected slowdown; it may
  come back to spot once its deadline cannot be met anyway, or, kept off by its preemptions
  alone, after waiting twice `spot_max_wait_s` for on-demand since it was last queued. A job
  without a deadline that has waited `spot_max_wait_s` for spot may also take on-demand.

A spot run is expected to take longer than an on-demand one: each preemption costs the work
since the last checkpoint (half the checkpoint interval on average) plus a restart. With
preemption rate λ per hour and a run of D hours, about λ·D preemptions are expected, so the run
takes D·(1 + λ·(interval/2 + restart)) — the job may use spot if that, times `SAFETY`, ends
before its deadline. `max_price` (per GPU-hour) keeps pools above it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPOT, ON_DEMAND, RESERVED = "spot", "on_demand", "reserved"
KINDS = (SPOT, ON_DEMAND, RESERVED)
CAPACITIES = ("auto", SPOT, ON_DEMAND)
SAFETY = 1.25  # margin on a spot run's expected duration before a deadline


@dataclass(frozen=True)
class Pool:
    name: str
    kind: str
    price_per_gpu_hour: float
    preemptions_per_hour: float = 0.0  # reclaims per node-hour (spot)


@dataclass(frozen=True)
class CapacityAsk:
    """What a job asked for, and what it has been through."""

    capacity: str = "auto"
    deadline: float | None = None  # unix seconds
    max_price: float | None = None  # per GPU-hour
    spot_preemptions: int = 0  # times spot capacity took its attempts away (reclaims, lost spot nodes)
    queued_at: float = 0.0
    nodes: int = 1  # nodes it spans: each one is reclaimed on its own
    waiting_since: float | None = None  # when it was last queued (its last attempt's end); None: queued_at

    @property
    def waited_from(self) -> float:
        return self.queued_at if self.waiting_since is None else self.waiting_since


@dataclass(frozen=True)
class SpotRules:
    max_preemptions: int = 2
    max_wait_s: float = 1800.0
    checkpoint_interval_s: float = 600.0
    restart_s: float = 120.0


def spot_duration_s(runtime_s: float, pool: Pool, rules: SpotRules, nodes: int = 1) -> float:
    """How long `runtime_s` of work on `nodes` nodes is expected to take on `pool`, preemptions
    included (a job on n nodes is hit n times as often)."""
    lost_per_preemption_h = (rules.checkpoint_interval_s / 2 + rules.restart_s) / 3600
    return runtime_s * (1 + max(1, nodes) * pool.preemptions_per_hour * lost_per_preemption_h)


def preemption_allowance(runtime_s: float, pool: Pool, rules: SpotRules, nodes: int = 1) -> float:
    """How many spot preemptions an auto job may take before it leaves spot: the configured
    number beyond what its size and length make expected there (n nodes x hours x rate)."""
    expected = max(1, nodes) * pool.preemptions_per_hour * runtime_s / 3600
    return rules.max_preemptions + expected


def allowed_pools(ask: CapacityAsk, runtime_s: float, pools: Sequence[Pool], now: float,
                  rules: SpotRules = SpotRules()) -> tuple[str, ...]:
    """The pools the job may start on now, cheapest first (ties: reserved, on-demand, spot).
    Empty: none now (a `spot` job over its price cap, say) — it waits."""
    affordable = [p for p in pools if ask.max_price is None or p.price_per_gpu_hour <= ask.max_price]
    steady = [p for p in affordable if p.kind != SPOT]
    spot = [p for p in affordable if p.kind == SPOT]
    if ask.capacity == ON_DEMAND:
        chosen = steady
    elif ask.capacity == SPOT:
        chosen = spot
    else:
        usable_spot = [p for p in spot if _spot_fits(ask, runtime_s, p, now, rules)]
        if not usable_spot:  # past its deadline, or kept off spot by its preemptions and waiting long
            usable_spot = [p for p in spot if _back_to_spot(ask, runtime_s, p, now, rules)]
        chosen = usable_spot
        if not usable_spot or _needs_steady(ask, runtime_s, now, rules):
            chosen = usable_spot + steady
    order = {RESERVED: 0, ON_DEMAND: 1, SPOT: 2}
    return tuple(p.name for p in sorted(chosen, key=lambda p: (p.price_per_gpu_hour, order[p.kind], p.name)))


def _spot_fits(ask: CapacityAsk, runtime_s: float, pool: Pool, now: float, rules: SpotRules) -> bool:
    if ask.spot_preemptions >= preemption_allowance(runtime_s, pool, rules, ask.nodes):
        return False
    return ask.deadline is None or now + SAFETY * spot_duration_s(runtime_s, pool, rules, ask.nodes) <= ask.deadline


def _back_to_spot(ask: CapacityAsk, runtime_s: float, pool: Pool, now: float, rules: SpotRules) -> bool:
    """Whether an auto job that spot's rules keep off spot may use it again: its deadline cannot
    be met anyway (nothing is left to protect), or its preemptions alone keep it off and it has
    waited for on-demand, since it was last queued, twice as long as a job waits for spot before
    taking on-demand. A job that spot's slowdown would make late stays on on-demand: moving it
    back and forth would only cost restarts."""
    if ask.deadline is not None and now + runtime_s > ask.deadline:
        return True
    meets_deadline = ask.deadline is None or \
        now + SAFETY * spot_duration_s(runtime_s, pool, rules, ask.nodes) <= ask.deadline
    return meets_deadline and now - ask.waited_from >= 2 * rules.max_wait_s


def _needs_steady(ask: CapacityAsk, runtime_s: float, now: float, rules: SpotRules) -> bool:
    """Whether an auto job may also take on-demand now, though spot could still do: waiting for
    spot would put its deadline at risk, or (without one) it has waited long enough."""
    if ask.deadline is None:
        return now - ask.waited_from >= rules.max_wait_s
    slack = ask.deadline - now - SAFETY * runtime_s
    return slack < rules.max_wait_s


def at_risk(ask: CapacityAsk, remaining_s: float, pool: Pool, now: float, rules: SpotRules = SpotRules()) -> bool:
    """Whether an auto job running on spot `pool` should move to on-demand now (checkpoint, then
    requeue): the rest of its work, with spot's expected preemptions and the margin, would end
    past its deadline."""
    return (ask.capacity == "auto" and pool.kind == SPOT and ask.deadline is not None
            and now + SAFETY * spot_duration_s(remaining_s, pool, rules, ask.nodes) > ask.deadline
            and now + remaining_s <= ask.deadline)  # on-demand can still make it: moving helps


def pool_of(node: str, pools: Mapping[str, Sequence[str]]) -> str:
    """The pool whose node list names `node` ("" when none does)."""
    for name, nodes in pools.items():
        if node in nodes:
            return name
    return ""


@dataclass(frozen=True)
class PoolSetup:
    """The operator's pools, as the scheduler applies them."""

    pools: Mapping[str, Pool]
    node_lists: Mapping[str, Sequence[str]]
    by_tier: Mapping[str, str]
    rules: SpotRules
    default_price: float  # per GPU-hour, of a node in no pool

    @classmethod
    def from_settings(cls, settings: Any) -> PoolSetup | None:
        if not settings.capacity_pools:
            return None
        return cls(
            pools={name: Pool(name, p.kind, p.price_per_gpu_hour, p.preemptions_per_hour)
                   for name, p in settings.capacity_pools.items()},
            node_lists={name: tuple(p.nodes) for name, p in settings.capacity_pools.items()},
            by_tier=dict(settings.capacity_by_tier),
            rules=SpotRules(max_preemptions=settings.spot_max_preemptions, max_wait_s=settings.spot_max_wait_s),
            default_price=settings.price_per_gpu_hour.get(settings.gpu_type,
                                                          settings.price_per_gpu_hour.get("default", 0.0)))

    def node_pool(self, node: str, reported: str = "") -> str:
        return reported if reported in self.pools else pool_of(node, self.node_lists)

    def ask(self, tier: str, capacity: str, deadline: float | None, max_price: float | None,
            spot_preemptions: int, queued_at: float, nodes: int = 1,
            waiting_since: float | None = None) -> CapacityAsk:
        return CapacityAsk(capacity or self.by_tier.get(tier, "auto"), deadline, max_price, spot_preemptions,
                           queued_at, nodes, waiting_since)

    def price(self, pool: str) -> float:
        return self.pools[pool].price_per_gpu_hour if pool in self.pools else self.default_price

    def on_demand_price(self) -> float:
        """What the same GPU-hour costs on demand: the cheapest on-demand pool's price."""
        steady = [p.price_per_gpu_hour for p in self.pools.values() if p.kind == ON_DEMAND]
        return min(steady) if steady else self.default_price
