"""How the CLI reaches a tuneforge server: where, with which key, and what a failure looks like.

The server is the `/v1` URL in TUNEFORGE_BASE_URL (or OPENAI_BASE_URL, as the openai SDK reads
it; a URL without `/v1` gets it added), default this host's configured API; the key is
TUNEFORGE_API_KEY (or OPENAI_API_KEY). Every failure becomes one readable line and an exit code:

    0  done
    1  the server refused the request (4xx: the message, code and field it names), a job the
       command waited for failed or was cancelled, or a data file failed validation
    2  bad usage: a missing key, a bad option or file
    3  the server could not be reached (connection refused, DNS, timeout)
    4  the server failed (5xx; its request id is in the message)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import httpx
import typer

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_SERVER = 1, 2, 3, 4
# a data file that failed validation (an upload's, or `files validate`'s) is refused data: 1 as well
EXIT_INVALID_DATA = EXIT_REFUSED
TIMEOUT = httpx.Timeout(60.0, connect=10.0)


# the click exception typer turns into "print, exit with its code" (typer vendors its own click)
_ClickException = next(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "ClickException")


class CliFailure(_ClickException):
    """One line for the user (on stderr) and the exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        typer.echo(f"error: {self.message}", file=file or sys.stderr)


def base_url() -> str:
    """The server's /v1 URL."""
    given = os.environ.get("TUNEFORGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
    if not given:
        from tuneforge.settings import get_settings

        given = get_settings().resolved_public_url
    given = given.rstrip("/")
    return given if given.endswith("/v1") else f"{given}/v1"


def api_key() -> str:
    key = os.environ.get("TUNEFORGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if not key:
        raise CliFailure("set TUNEFORGE_API_KEY (or OPENAI_API_KEY) to your API key", EXIT_USAGE)
    return key


class Api:
    """JSON over HTTP to the server's /v1 API; every failure raised as a CliFailure."""

    def __init__(self, http: httpx.Client | None = None, *, url: str | None = None, key: str | None = None) -> None:
        self.url = url or base_url()
        self.key = key or api_key()
        self.http = http or httpx.Client(timeout=TIMEOUT, trust_env=True)

    def _url(self, path: str) -> str:
        return f"{self.url}{path}"

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", **(extra or {})}

    def request(self, method: str, path: str, *, params: dict | None = None, json_body: Any = None,
                headers: dict[str, str] | None = None, **options: Any) -> Any:
        with self._failures():
            response = self.http.request(method, self._url(path), params=_clean(params), json=json_body,
                                         headers=self._headers(headers), **options)
        check(response)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, *, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, json_body=body, headers=headers)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def pages(self, path: str, *, most: int | None = None, page_size: int | None = None,
              **params: Any) -> Iterator[dict]:
        """Every item of a list endpoint, following `after` while `has_more`; at most `most`."""
        after, seen = None, 0
        while True:
            page = self.get(path, **params, after=after, limit=page_size)
            for item in page.get("data", []):
                yield item
                seen += 1
                if most is not None and seen >= most:
                    return
            if not page.get("has_more") or not page.get("data"):
                return
            after = page["data"][-1]["id"]

    def upload(self, path: str, handle: IO[bytes], filename: str, fields: dict[str, str]) -> Any:
        """A multipart upload streamed from `handle` (read in chunks: never whole in memory)."""
        with self._failures():
            response = self.http.post(self._url(path), files={"file": (filename, handle)}, data=fields,
                                      headers=self._headers(), timeout=httpx.Timeout(None, connect=10.0))
        check(response)
        return response.json()

    @contextmanager
    def stream(self, method: str, path: str, *, params: dict | None = None,
               timeout: httpx.Timeout | None = None) -> Iterator[httpx.Response]:
        with self._failures():
            with self.http.stream(method, self._url(path), params=_clean(params), headers=self._headers(),
                                  timeout=timeout or httpx.Timeout(None, connect=10.0)) as response:
                if response.status_code >= 400:
                    response.read()
                    check(response)
                yield response

    @contextmanager
    def _failures(self) -> Iterator[None]:
        try:
            yield
        except httpx.TimeoutException:
            raise CliFailure(f"the tuneforge server at {self.url} did not answer in time", EXIT_UNREACHABLE) from None
        except httpx.TransportError as exc:
            why = _reason(exc)
            raise CliFailure(f"cannot reach the tuneforge server at {self.url} ({why}); set TUNEFORGE_BASE_URL "
                             "to its /v1 URL", EXIT_UNREACHABLE) from None


def _clean(params: dict | None) -> dict | None:
    return None if params is None else {k: v for k, v in params.items() if v is not None}


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc).lower()
    for needle, said in (("refused", "connection refused"), ("name or service", "unknown host"),
                         ("nodename", "unknown host"), ("certificate", "TLS certificate not trusted")):
        if needle in text:
            return said
    return type(exc).__name__


def check(response: httpx.Response) -> None:
    """A CliFailure for a 4xx/5xx answer: the server's message, code and field in one line."""
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = error.get("message") or response.reason_phrase or "request failed"
    details = ", ".join(part for part in (error.get("code") and f"code {error['code']}",
                                          error.get("param") and f"field {error['param']}") if part)
    line = f"HTTP {response.status_code}: {message}" + (f" ({details})" if details else "")
    if response.status_code == 429 and response.headers.get("retry-after"):
        line += f"; retry after {response.headers['retry-after']} s"
    raise CliFailure(line, EXIT_SERVER if response.status_code >= 500 else EXIT_REFUSED)


def sse_data(response: httpx.Response) -> Iterator[Any]:
    """The JSON of each `data:` frame of a Server-Sent Events answer, until `[DONE]`."""
    lines: list[str] = []
    for line in response.iter_lines():
        if line:
            if line.startswith("data:"):
                lines.append(line[5:].lstrip())
            continue
        if lines:
            data = "\n".join(lines)
            lines = []
            if data == "[DONE]":
                return
            yield json.loads(data)
