"""Per-step telemetry: real-token throughput, padding, peak memory, and MFU on a GPU.

`tokens_per_second` counts only real tokens (the examples' own, never padding);
`padding_fraction` is the share of computed positions that were padding;
`peak_memory_mb` is the accelerator's peak allocated memory on a GPU, the
process's peak resident set on a CPU. `mfu` (GPU only) is model FLOPs
utilisation: 6 × parameters × real tokens/s (forward and backward through
every weight; a LoRA step also back-propagates through the frozen weights,
so the count is the same) over the GPU's peak dense bf16 FLOPs, from
`TUNEFORGE_GPU_PEAK_TFLOPS` or a table of known GPUs.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import torch

# dense bf16 tensor-core peaks, TFLOP/s (vendor data sheets)
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0,
               "RTX 4090": 165.0, "V100": 125.0}


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    configured = os.environ.get("TUNEFORGE_GPU_PEAK_TFLOPS")
    if configured:
        return float(configured)
    name = torch.cuda.get_device_name(device)
    return next((tflops for key, tflops in PEAK_TFLOPS.items() if key in name), None)


def step_telemetry(*, num_tokens: int, num_slots: int, elapsed_s: float, parameters: int,
                   device: torch.device, gpus: int = 1) -> dict[str, Any]:
    tokens_per_second = num_tokens / max(elapsed_s, 1e-9)
    data: dict[str, Any] = {
        "tokens_per_second": tokens_per_second,
        "padding_fraction": round(1.0 - num_tokens / num_slots, 6) if num_slots else 0.0,
        "peak_memory_mb": round(peak_memory_mb(device), 1),
    }
    peak = peak_tflops(device)
    if peak:
        data["mfu"] = round(6.0 * parameters * tokens_per_second / (peak * 1e12 * max(1, gpus)), 6)
    return data
