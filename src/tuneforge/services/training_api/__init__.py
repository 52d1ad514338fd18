"""The training API (Tinker's wire format): sessions, LoRA models co-trained on shared bases,
futures, checkpoints. `TrainingApiHost` is one API process's: made on the first request, on the
event loop it serves."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tuneforge.services.training_api.broker import Broker, Pool
from tuneforge.services.training_api.job_clients import JobClients
from tuneforge.services.training_api.pools import LocalPools
from tuneforge.services.training_api.scheduled import OWNER_EVERY_S, ScheduledPools
from tuneforge.services.training_api.service import TrainingApi

log = logging.getLogger(__name__)


class TrainingApiHost:
    def __init__(self, platform: Any) -> None:
        self.platform = platform
        self._api: TrainingApi | None = None
        self._pools: LocalPools | ScheduledPools | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def api(self) -> TrainingApi:
        if self._api is None:
            settings = self.platform.settings
            self._loop = asyncio.get_running_loop()
            pools: LocalPools | ScheduledPools
            if settings.training_api_workers == "scheduled":
                pools = ScheduledPools(self.platform, self._loop)
                self._owner = self._loop.create_task(self._mark_owned(pools))
                retire = pools.retire
            else:
                pools, retire = LocalPools(self.platform, self._loop), None
            broker = Broker(cycle_tokens=settings.training_api_cycle_tokens,
                            models_per_tenant=settings.training_api_models_per_tenant,
                            queued_per_tenant=settings.training_api_queued_per_tenant, launch=pools.launch,
                            retire=retire)
            pools.broker = broker
            self._pools, self._api = pools, TrainingApi(self.platform, broker)
            self._jobs = JobClients(self._api)
            self._housekeeping = self._loop.create_task(self._api.housekeeping())
        return self._api

    def job_clients(self) -> JobClients:
        """Ordinary jobs training on the shared pools (`job_clients.py`)."""
        self.api()
        return self._jobs

    async def _mark_owned(self, pools: ScheduledPools) -> None:
        """Forever: this process's pool jobs are marked as still served (`scheduled.OWNER_GONE_S`)."""
        from starlette.concurrency import run_in_threadpool

        while True:
            await asyncio.sleep(OWNER_EVERY_S)
            try:
                await run_in_threadpool(pools.mark_owned)
            except Exception:  # noqa: BLE001 - the next round tries again; logged
                log.exception("marking the co-training pool jobs as served")

    async def pool(self, pool_id: str, token: str) -> Pool:
        """The pool whose worker asks for work; 401 unless `token` is its: a scheduled pool's
        attempt's job token, or a process pool's own token."""
        from tuneforge.domain.errors import unauthorized

        if self._api is None:  # no training API in this process yet: no pool of it either
            raise unauthorized("invalid pool token", code="invalid_pool_token")
        api = self._api
        if isinstance(self._pools, ScheduledPools):
            found = next((pool for pool in api.broker.pools.values() if pool.pool_id == pool_id), None)
            attempt = await self._pools.authorize(pool_id, token) if found is not None else None
            if found is None or attempt is None:
                raise unauthorized("invalid pool token", code="invalid_pool_token")
            api.broker.attempt_started(found, attempt)
            return found
        return api.broker.pool_by_id(pool_id, token)

    def close(self, wait_s: float = 5.0) -> None:
        """Called from outside the event loop when the process stops: the workers are told to stop
        (each answers its pending request for work and exits), then ended if they linger."""
        if self._api is None or self._pools is None or self._loop is None:
            return
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._api.broker.close)
        self._pools.stop_all(wait_s)
