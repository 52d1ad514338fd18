"""Response headers built from tenant-chosen text."""

from __future__ import annotations

import re
from urllib.parse import quote

_NOT_PLAIN = re.compile(r'[^\x20-\x7e]|["\\]')


def attachment(filename: str) -> str:
    """`Content-Disposition` for a download named `filename`: an ASCII fallback (`filename=`, other
    characters as `_`) for old clients and the exact name in RFC 5987's `filename*=UTF-8''...`.
    Header values are Latin-1 on the wire: a non-ASCII name written as is cannot be sent."""
    fallback = _NOT_PLAIN.sub("_", filename) or "download"
    if fallback == filename:
        return f'attachment; filename="{filename}"'
    exact = quote(filename.encode("utf-8", "surrogatepass"), safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{exact}"
