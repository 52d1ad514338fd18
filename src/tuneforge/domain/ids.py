"""Public ids in OpenAI's style: `file-…`, `ftjob-…`, `ftevent-…`, `ftckpt-…`, `upload_…`, `part_…`."""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24, sep: str = "-") -> str:
    """`file-…`; OpenAI's newer objects use "_" (`upload_…`, `part_…`)."""
    return f"{prefix}{sep}" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def short_id(length: int = 8) -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))


def correlation_id(prefix: str = "err") -> str:
    """`err_…` (a trainer failure) or `req_…` (a request the API could not serve): the handle an
    operator greps the logs for, shown to the tenant instead of the details it stands for."""
    return f"{prefix}_{secrets.token_hex(8)}"
