"""Encryption at rest of what the platform must be able to read back: tenant
secrets and webhook signing secrets.

Values are sealed with Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`)
under the keys of `TUNEFORGE_SECRETS_KEY`: a comma-separated list of Fernet
keys, newest first. The first key seals; every key opens, so a key can be
rotated without downtime:

1. put a new key in front (`tuneforge secrets new-key` prints one):
   `TUNEFORGE_SECRETS_KEY=NEW,OLD` on every control plane;
2. `tuneforge secrets rotate` re-seals every stored value under NEW;
3. drop OLD from the setting.

Without the setting, a single-host install generates a key once in
HOME/secrets.key (mode 0600). Several control planes must share one key, so a
clustered deployment sets the variable (from its secret manager).

A sealed value is stored as `enc:v1:<fernet token>`; anything else is a value
written before encryption existed, read as it is and sealed by the next
rotation.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from tuneforge.security.env import private_dirs

log = logging.getLogger(__name__)

SEALED_PREFIX = "enc:v1:"
KEY_FILE = "secrets.key"


class SecretsKeyError(Exception):
    """The configured keys are unusable, or a sealed value opens under none of them."""


@dataclass(frozen=True)
class Sealer:
    """Seals and opens short strings under the platform's keys (first seals, all open)."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise SecretsKeyError("no encryption key configured")
        try:
            object.__setattr__(self, "_fernet", MultiFernet([Fernet(key) for key in self.keys]))
        except (ValueError, TypeError):
            raise SecretsKeyError("TUNEFORGE_SECRETS_KEY must be comma-separated Fernet keys "
                                  "(32 url-safe base64-encoded bytes each; `tuneforge secrets new-key`)") from None

    @classmethod
    def parse(cls, text: str) -> Sealer:
        return cls(tuple(part.strip().encode() for part in text.split(",") if part.strip()))

    def seal(self, value: str) -> str:
        return SEALED_PREFIX + self._fernet.encrypt(value.encode()).decode()  # type: ignore[attr-defined]

    def open(self, stored: str) -> str:
        """The plain value of `stored` (a value stored before encryption is returned as it is)."""
        if not is_sealed(stored):
            return stored
        try:
            return self._fernet.decrypt(stored[len(SEALED_PREFIX):].encode()).decode()  # type: ignore[attr-defined]
        except InvalidToken:
            raise SecretsKeyError("a stored secret opens under none of the keys in TUNEFORGE_SECRETS_KEY "
                                  "(was a key dropped before `tuneforge secrets rotate`?)") from None

    def reseal(self, stored: str) -> str:
        """`stored` sealed under the newest key (rotation); plain legacy values get sealed."""
        if not is_sealed(stored):
            return self.seal(stored)
        try:
            token = self._fernet.rotate(stored[len(SEALED_PREFIX):].encode())  # type: ignore[attr-defined]
        except InvalidToken:
            raise SecretsKeyError("a stored secret opens under none of the keys in TUNEFORGE_SECRETS_KEY") from None
        return SEALED_PREFIX + token.decode()


def is_sealed(stored: str) -> bool:
    return stored.startswith(SEALED_PREFIX)


def new_key() -> str:
    return Fernet.generate_key().decode()


def sealer_for(configured: str | None, home: Path) -> Sealer:
    """The sealer of a platform: its configured keys, else the key file in `home` (made once)."""
    if configured and configured.strip():
        return Sealer.parse(configured)
    return Sealer((_home_key(home),))


def _home_key(home: Path) -> bytes:
    path = home / KEY_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    private_dirs(home)
    key = Fernet.generate_key()
    try:  # O_EXCL: two processes starting at once keep the first one's key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as handle:
        handle.write(key + b"\n")
    log.warning("generated the secrets key %s; control planes that share a database must share one key: "
                "set TUNEFORGE_SECRETS_KEY on each", path)
    return key
