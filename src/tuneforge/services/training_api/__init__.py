"""The training API (Tinker's wire format): sessions, LoRA models co-trained on shared bases,
futures, checkpoints. `TrainingApiHost` is one API process's: made on the first request, on the
event loop it serves."""

from __future__ import annotations

import asyncio
from typing import Any

from tuneforge.services.training_api.broker import Broker
from tuneforge.services.training_api.pools import LocalPools
from tuneforge.services.training_api.service import TrainingApi


class TrainingApiHost:
    def __init__(self, platform: Any) -> None:
        self.platform = platform
        self._api: TrainingApi | None = None
        self._pools: LocalPools | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def api(self) -> TrainingApi:
        if self._api is None:
            settings = self.platform.settings
            self._loop = asyncio.get_running_loop()
            pools = LocalPools(self.platform, self._loop)
            broker = Broker(cycle_tokens=settings.training_api_cycle_tokens,
                            models_per_tenant=settings.training_api_models_per_tenant,
                            queued_per_tenant=settings.training_api_queued_per_tenant, launch=pools.launch)
            pools.broker = broker
            self._pools, self._api = pools, TrainingApi(self.platform, broker)
            self._housekeeping = self._loop.create_task(self._api.housekeeping())
        return self._api

    def check_pool(self, pool_id: str, token: str) -> None:
        """Raises 401 unless `token` is the pool's (a worker of this process's)."""
        from tuneforge.domain.errors import unauthorized

        if self._api is None:
            raise unauthorized("invalid pool token", code="invalid_pool_token")
        self._api.broker.pool_by_id(pool_id, token)

    def close(self, wait_s: float = 5.0) -> None:
        """Called from outside the event loop when the process stops: the workers are told to stop
        (each answers its pending request for work and exits), then ended if they linger."""
        if self._api is None or self._pools is None or self._loop is None:
            return
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._api.broker.close)
        self._pools.stop_all(wait_s)
