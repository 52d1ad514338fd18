"""The egress policy at connect time for client libraries that cannot be handed a transport of
ours and connect through urllib3 / `requests` (MLflow's REST client): see `guard_urllib3`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from tuneforge.security.egress import EgressPolicy, _canonical


def guard_urllib3(policy: EgressPolicy, *, exempt: Iterable[str] = ()) -> None:
    """Every connection urllib3 (and so `requests`) opens in this process passes `policy` at
    connect time, as the clients above do: the host is resolved and checked here and the
    checked address connected to (TLS still names and verifies the URL's host); redirects
    are checked like first requests. `exempt`: host names of the operator's own servers.

    For a client library that cannot be handed a transport (MLflow's REST client): a trainer
    calls this before such a library talks to a tenant's URL. A later call replaces the
    policy; the process is the job's own, so nothing else is affected."""
    from urllib3.util import connection

    original = getattr(connection.create_connection, "tuneforge_original", connection.create_connection)
    trusted = frozenset(_canonical(host) for host in exempt if host)

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        host, port = address
        if _canonical(host) in trusted:
            return original(address, *args, **kwargs)
        try:
            addresses = policy.addresses_for(host)
        except httpx.ConnectError as exc:  # urllib3 reports an OSError as a failed connection
            raise OSError(f"egress refused: {exc}") from None
        last: OSError | None = None
        for checked in addresses:
            try:
                return original((checked, port), *args, **kwargs)
            except OSError as exc:
                last = exc
        assert last is not None
        raise last

    create_connection.tuneforge_original = original  # type: ignore[attr-defined]
    connection.create_connection = create_connection
