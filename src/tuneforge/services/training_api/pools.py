"""The co-training workers of this control plane: one process per base model, started when the
base's first training-API request arrives (`python -m tuneforge.train.cotrain_worker`, the
trainers' allow-listed environment, its spec on stdin), watched by a thread: a worker that exits
is reported to the broker, which fails what it was running and forgets what it hosted."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tuneforge.security.env import child_env
from tuneforge.services.training_api.broker import Broker, Pool

log = logging.getLogger(__name__)


class LocalPools:
    def __init__(self, platform: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.platform = platform
        self.loop = loop
        self.broker: Broker | None = None
        self.processes: dict[str, subprocess.Popen] = {}

    def launch(self, pool: Pool) -> None:
        threading.Thread(target=self._run, args=(pool,), name=f"cotrain-{pool.pool_id}", daemon=True).start()

    def _run(self, pool: Pool) -> None:
        why = "it could not start"
        try:
            base_dir = self._base_dir(pool.base)
            settings = self.platform.settings
            spec = {"pool_id": pool.pool_id, "token": pool.token, "callback_url": settings.resolved_public_url,
                    "base_dir": str(base_dir), "base_name": pool.base, "device": settings.training_api_pool_device,
                    "max_pass_tokens": settings.training_api_cycle_tokens}
            env = child_env({**settings.trainer_env(), "TOKENIZERS_PARALLELISM": "false"})
            process = subprocess.Popen([sys.executable, "-m", "tuneforge.train.cotrain_worker"], stdin=subprocess.PIPE,
                                       env=env, start_new_session=True)
            self.processes[pool.pool_id] = process
            assert process.stdin is not None
            process.stdin.write(json.dumps(spec).encode())
            process.stdin.close()
            code = process.wait()
            why = f"exit code {code}"
        except Exception:  # noqa: BLE001 - logged; the pool's requests fail as the platform's fault
            log.exception("co-training worker of %s", pool.base)
        finally:
            self.processes.pop(pool.pool_id, None)
        if self.broker is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.broker.worker_lost, pool, why)

    def _base_dir(self, name: str) -> Path:
        from tuneforge.domain.spec import BaseModelRef
        from tuneforge.services.serving import base_models
        from tuneforge.storage import layout
        from tuneforge.storage.model_cache import fetch_base_model

        with self.platform.db.session() as session:
            row = base_models.find(session, name)
            if row is None:
                raise LookupError(name)
            ref = BaseModelRef(row.name, row.sha256, row.prefix, row.source)
        cache = layout.base_model_cache_dir(layout.local_cache_dir(self.platform.settings.home))
        return fetch_base_model(self.platform.store, ref, cache)

    def stop_all(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        for process in list(self.processes.values()):
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.terminate()
