"""URLs as they may be shown: in logs, on the console, in error messages.

`redact_url` replaces the password of a URL's user part and the values of query
parameters that hold secrets with `***`; everything else (scheme, user name, host, port,
path) stays, so the output still says which database or bucket is meant. A local path is
returned as it is.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

MASK = "***"

# query parameters whose value is a secret: libpq's password and SSL key options, S3's
# presigned signature and credential, access tokens and keys of any kind
_SECRET_WORDS = ("password", "passwd", "secret", "token", "key", "signature", "credential", "auth", "sslcert")
_SECRET_NAMES = {"pwd", "pass", "sig", "x-amz-security-token"}


def _secret_param(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_NAMES or any(word in lowered for word in _SECRET_WORDS)


def redact_url(url: str | None) -> str:
    """`url` with its password and secret query values replaced by `***`, e.g.
    postgresql+psycopg://app:***@db:5432/tuneforge?sslmode=require."""
    if not url:
        return ""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text  # a local path: sqlite files, object-store folders
    # split by hand rather than with urllib: it keeps 'sqlite:////abs/path' as it is and never
    # refuses a malformed host (which would leave the caller to show the text unredacted)
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    tail, hashmark, fragment = tail.partition("#")
    path, qmark, query = tail.partition("?")
    userinfo, at, host = netloc.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else f"{user}@{host}"
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_param(name) for name, _value in pairs):
            query = urlencode([(name, MASK if _secret_param(name) else value) for name, value in pairs], safe="*")
    return f"{scheme}://{netloc}{path}{qmark}{query}{hashmark}{fragment}"
