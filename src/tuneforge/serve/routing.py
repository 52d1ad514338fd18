"""Which version of a route serves a request: by weight, and the same one for the same user.

A route's versions carry integer weights (their sum is the whole). A request without a `user`
draws a point uniformly in [0, sum) from the random source; a request with one takes the point
`sha256(route key, user)` maps to, so one user always lands on the same version while the
weights stay as they are. The versions cut [0, sum) into consecutive intervals in their order,
and the point's interval names the version. Changing a weight moves only the users whose point
falls in an interval that moved.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

_SYSTEM = random.SystemRandom()
_HASH_SPACE = 2 ** 64


@dataclass(frozen=True)
class Version:
    model: str
    weight: int


def pick(route_key: str, versions: Sequence[Version], user: str | None = None,
         rng: random.Random | None = None) -> Version:
    """The version that serves this request. `route_key` identifies the route (its id): two routes
    of one tenant split one user independently."""
    total = sum(version.weight for version in versions)
    if total <= 0:
        raise ValueError("a route needs a version with a positive weight")
    if user is None:
        point = (rng or _SYSTEM).randrange(total)
    else:
        digest = hashlib.sha256(f"{route_key}\x00{user}".encode()).digest()
        point = int.from_bytes(digest[:8], "big") * total // _HASH_SPACE
    for version in versions:
        if point < version.weight:
            return version
        point -= version.weight
    raise AssertionError("unreachable: the point lies below the total weight")
