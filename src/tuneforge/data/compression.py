"""Gunzip with a fuse: decompression that stops before a small file becomes a huge one.

A gzip bomb is a few kilobytes that expand to gigabytes. The guard counts
bytes in and out as it goes and raises `compression_bomb` as soon as the
output passes the absolute cap or the ratio cap, so memory and disk never see
more than one chunk past the limit.
"""

from __future__ import annotations

import zlib
from typing import IO

from tuneforge.data.example import DataIssue
from tuneforge.data.limits import ReadLimits

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS
# Small input reads keep the measured ratio honest: the guard only knows the
# compressed bytes it has pulled, not the ones the decompressor has used.
_RAW_CHUNK_BYTES = 64 * 1024


def gunzip_head(head: bytes, max_bytes: int) -> bytes:
    """The first `max_bytes` (at most) of what a gzip stream starting with `head` expands to."""
    try:
        return zlib.decompressobj(_GZIP_WBITS).decompress(head, max_bytes)
    except zlib.error as exc:
        raise DataIssue("invalid_compression", f"not a valid gzip stream ({exc})") from None


class GuardedGunzip:
    """A read-only stream of the gunzipped bytes of `raw`, within `limits`.

    Handles multi-member gzip files (concatenated streams) like `gzip` does.
    """

    def __init__(self, raw: IO[bytes], limits: ReadLimits) -> None:
        self._raw = raw
        self._limits = limits
        self._decompressor = zlib.decompressobj(_GZIP_WBITS)
        self._pending = b""  # compressed input the decompressor has not taken yet
        self._finished = False
        self.compressed_bytes = 0
        self.decompressed_bytes = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to `size` decompressed bytes (fewer is not the end); b"" at the end."""
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(_RAW_CHUNK_BYTES * 16), b""))
        while size > 0 and not self._finished:
            if self._decompressor.eof and not self._start_next_member():
                break
            if not self._pending:
                self._pending = self._read_raw()
                if not self._pending:
                    raise DataIssue("invalid_compression", "the gzip stream is truncated")
            try:
                out = self._decompressor.decompress(self._pending, size)
            except zlib.error as exc:
                raise DataIssue("invalid_compression", f"corrupt gzip data ({exc})") from None
            self._pending = self._decompressor.unconsumed_tail
            if out:
                self._account(len(out))
                return out
        return b""

    def close(self) -> None:
        self._finished = True

    def _read_raw(self) -> bytes:
        data = self._raw.read(_RAW_CHUNK_BYTES)
        self.compressed_bytes += len(data)
        return data

    def _start_next_member(self) -> bool:
        """After one gzip member ends: start the next one, or finish (False)."""
        rest = self._decompressor.unused_data + self._pending
        # gzip(1) allows zero padding after the last member.
        while not rest.strip(b"\x00"):
            rest = self._read_raw()
            if not rest:
                self._finished = True
                return False
        self._decompressor = zlib.decompressobj(_GZIP_WBITS)
        self._pending = rest.lstrip(b"\x00")
        return True

    def _account(self, produced_bytes: int) -> None:
        self.decompressed_bytes += produced_bytes
        limits = self._limits
        if self.decompressed_bytes > limits.max_decompressed_bytes:
            raise DataIssue(
                "compression_bomb",
                f"the file decompresses to more than {limits.max_decompressed_bytes} bytes",
            )
        if (
            self.decompressed_bytes > limits.ratio_grace_bytes
            and self.decompressed_bytes > limits.max_compression_ratio * max(self.compressed_bytes, 1)
        ):
            raise DataIssue(
                "compression_bomb",
                f"the file expands more than {limits.max_compression_ratio:g}x "
                f"({self.compressed_bytes} compressed bytes gave {self.decompressed_bytes})",
            )
