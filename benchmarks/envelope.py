"""What envelope encryption of tenants' objects costs: writing and reading one object through the
local object store plain (the baseline, `FsspecStore`) and sealed (`storage/envelope.EncryptingStore`),
in the same run, best of `--repeat`.

    python benchmarks/envelope.py --mib 256 --repeat 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time
from pathlib import Path

from tuneforge.storage.envelope import EncryptingStore
from tuneforge.storage.store import FsspecStore


class _Keys:
    def __init__(self) -> None:
        self._key = os.urandom(32)

    def current(self, tenant_id: str) -> tuple[str, bytes]:
        return "k", self._key

    def key(self, tenant_id: str, key_id: str) -> bytes:
        return self._key


def _best(action, repeat: int) -> float:  # noqa: ANN001
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def measure(store: FsspecStore, data: bytes, repeat: int, scratch: Path) -> dict[str, float]:
    key = "tenants/t-bench/files/f-1/train.jsonl"
    write_s = _best(lambda: store.put_stream(key, io.BytesIO(data)), repeat)
    read_s = _best(lambda: store.get_file(key, scratch / "copy"), repeat)
    assert (scratch / "copy").stat().st_size == len(data)
    mib = len(data) / 2**20
    return {"write_mib_s": round(mib / write_s, 1), "read_mib_s": round(mib / read_s, 1),
            "stored_bytes": (Path(store.url) / key).stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = os.urandom(args.mib * 2**20)
    with tempfile.TemporaryDirectory(prefix="tuneforge-envelope-") as tmp:
        root = Path(tmp)
        plain = measure(FsspecStore(str(root / "plain")), data, args.repeat, root)
        sealed = measure(EncryptingStore(str(root / "sealed"), keys=_Keys()), data, args.repeat, root)
    print(json.dumps({"object_mib": args.mib, "plain": plain, "sealed": sealed,
                      "sealed_vs_plain_write": round(sealed["write_mib_s"] / plain["write_mib_s"], 2),
                      "sealed_vs_plain_read": round(sealed["read_mib_s"] / plain["read_mib_s"], 2),
                      "overhead_bytes": sealed["stored_bytes"] - plain["stored_bytes"]}))


if __name__ == "__main__":
    main()
