"""The bounds the API puts on what a request may hold, in one place.

Request models and query parameters declare them (so the OpenAPI document
states them); `api/guard.py` applies the ones that hold for every body before
a route sees it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# JSON bodies of every route except the upload: job bodies, chat messages and trainer
# reports are far smaller; a larger body is refused with 413 before it is parsed.
MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
# Nesting of any JSON body: the deepest legitimate body (a job with eval metrics) is under 10.
MAX_JSON_DEPTH = 64
# Multipart framing around an uploaded file (boundaries, part headers, the purpose field):
# the edge allows this much on top of the tier's file limit; the file itself is counted exactly.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
# Values (array items, object members, the root) in one JSON body. Work and memory of a parse grow
# with the values, not the bytes: 16 MiB of `[0,0,...]` is 8 million of them (seconds of CPU and
# about a GiB of objects). The largest legitimate body is a completion prompt of token ids (a
# 128k-token context) or a trainer's batch of 1000 events: both well under this.
MAX_JSON_VALUES = 1 << 18
# A JSON body up to this size is checked on the event loop (a trip to a thread costs more than
# its parse); a larger one in a thread, so that the loop keeps answering other requests.
MAX_INLINE_JSON_BYTES = 16 * 1024
# Large JSON bodies checked at once by one API process; more wait for a turn, holding no thread.
MAX_CONCURRENT_JSON_CHECKS = 2

MAX_ID_CHARS = 256  # file, job, webhook and model ids, cursors
MAX_NAME_CHARS = 256  # tenant names, tiers, filenames
MAX_TEXT_CHARS = 4 * 1024 * 1024  # one chat message or prompt
MAX_GENERATED_TOKENS = 1 << 20
MAX_MESSAGES = 4096
MAX_LIST_ITEMS = 256
MONTH_PATTERN = r"^\d{4}-\d{2}$"  # a calendar month, YYYY-MM (services/tenancy/usage.py checks the range)

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]
