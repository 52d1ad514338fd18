"""Predicted vs measured peak training memory on this CPU: the table of docs/memory.md.

Measures the configurations of tests/unit/train/test_memory_estimate.py (RUNS,
the ones the test asserts on) and a few more (EXTRA_RUNS: a run with
negligible tensors, which shows the runtime's own overhead, eager attention,
bf16 weights as on a GPU, gradient checkpointing), each in a process of its
own, with the same worker as the test: first with glibc's mmap threshold
pinned (what the test asserts on), then with glibc's defaults (what a trainer
process gets today). Prints the machine, then a Markdown table.

    python benchmarks/memory_estimate.py            # ~1-2 minutes on 2 cores
    python benchmarks/memory_estimate.py --quick    # RUNS only, pinned allocator only
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the measuring code lives in the test module

from tests.unit.train.test_memory_estimate import (  # noqa: E402 - found through the path set above
    BAND,
    MODELS,
    PINNED_ALLOCATOR,
    RUNS,
    Run,
    measure,
    model_shape,
)
from tuneforge.planning.memory import MIB  # noqa: E402

EXTRA_RUNS = [
    Run("small", "lora", 1, 16),  # tensors of a few hundred KiB: the runtime's own overhead
    Run("medium", "lora", 1, 16),
    Run("small", "lora", 4, 512, attention="eager"),
    Run("medium", "lora", 2, 256, dtype="bfloat16"),
    Run("medium", "full", 2, 256, dtype="bfloat16"),
    Run("medium", "lora", 2, 512, gradient_checkpointing=True),
    Run("medium", "full", 2, 512, gradient_checkpointing=True),
]


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _memory_total() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) / 1024 ** 2:.1f} GiB"
    return "unknown"


def machine() -> list[str]:
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in ("torch", "transformers", "peft"))
    libc = " ".join(platform.libc_ver())
    return [
        f"date:     {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        (f"machine:  {_cpu_model()}, {os.cpu_count()} cores, {_memory_total()} RAM (MemTotal), "
         f"{platform.system()} {platform.release()}, {libc}"),
        f"load avg: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
        f"software: Python {platform.python_version()}, {versions}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the test's runs only, pinned allocator only")
    args = parser.parse_args()
    runs = list(RUNS) if args.quick else list(RUNS) + EXTRA_RUNS
    print("\n".join(machine()))
    with tempfile.TemporaryDirectory(prefix="tuneforge-memory-") as tmp:
        dirs = {name: Path(tmp) / name for name in MODELS}
        pinned = measure(dirs, runs, allocator=PINNED_ALLOCATOR)
        default = None if args.quick else measure(dirs, runs, build=False, allocator={})
        shapes = {name: model_shape(path) for name, path in dirs.items()}
    print(f"worker: {pinned['wall_s']:.1f} s (imports {pinned['import_s']:.1f} s) pinned"
          + ("" if default is None else f", {default['wall_s']:.1f} s default allocator"))
    print()
    print("| configuration | activations | loss buffers | layer backward | grads + AdamW | overhead | predicted | "
          "measured (pinned) | ratio | measured (glibc default) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for index, run in enumerate(runs):
        predicted = run.predict(shapes[run.model])
        peak = pinned["runs"][index]["peak_bytes"]
        cells = [
            ("**" if run in RUNS else "") + run.label + ("**" if run in RUNS else ""),
            f"{predicted.activations / MIB:.1f}", f"{predicted.logits / MIB:.1f}", f"{predicted.backward / MIB:.1f}",
            f"{(predicted.gradients + predicted.optimizer) / MIB:.1f}", f"{predicted.overhead / MIB:.1f}",
            f"{predicted.step_bytes / MIB:.1f}", f"{peak / MIB:.1f}", f"{predicted.step_bytes / peak:.2f}",
        ]
        if default is not None:
            other = default["runs"][index]["peak_bytes"]
            cells += [f"{other / MIB:.1f}", f"{predicted.step_bytes / other:.2f}"]
        else:
            cells += ["", ""]
        print("| " + " | ".join(cells) + " |")
    print()
    print(f"MiB above the loaded model; ratio = predicted / measured; bold: asserted by the test "
          f"(band {BAND[0]}-{BAND[1]}).")


if __name__ == "__main__":
    main()
