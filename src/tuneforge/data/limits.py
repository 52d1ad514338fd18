"""The bounds every dataset reader works within, whatever the file claims about itself."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class ReadLimits:
    """Caps that keep reading one dataset bounded in memory, disk and time."""

    max_line_bytes: int = 8 * MIB
    """Longest JSONL line (or CSV field) accepted; a longer one is `line_too_long`.
    Bounds the memory one row can take before it is even parsed."""

    max_decompressed_bytes: int = 16 * GIB
    """Most bytes a compressed file or archive may expand to (`compression_bomb`)."""

    max_compression_ratio: float = 100.0
    """Most decompressed bytes per compressed byte. Real JSONL compresses 5-20x;
    a bomb compresses 1000x."""

    ratio_grace_bytes: int = 4 * MIB
    """Output below this size is never called a bomb: a tiny, very repetitive
    file may compress far better than 100x and still be harmless."""

    max_archive_members: int = 10_000
    """Most entries an uploaded dataset archive may hold."""

    max_batch_bytes: int = 1 * GIB
    """Most bytes one Arrow record batch or Parquet row group may decode to: each is
    decompressed whole in memory, so this bounds one read whatever the file's ratio."""

    batch_rows: int = 1024
    """Rows turned into Python objects at a time when reading Parquet or Arrow."""


DEFAULT_LIMITS = ReadLimits()
