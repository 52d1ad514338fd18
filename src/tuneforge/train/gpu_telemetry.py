"""What the GPU itself says while a trainer runs, from NVML (`nvidia-ml-py`, module `pynvml`):
utilisation, memory used and its peak, power and temperature, sampled every `interval_s` by a
thread of the trainer (each rank its own GPU) and added to each step's metrics as

    gpu_utilization (0-1, the mean of the samples since the previous step),
    gpu_memory_used_mb (the last sample), gpu_memory_peak_mb (the attempt's highest),
    gpu_power_w (mean), gpu_temperature_c (highest),

which the events, the trackers, the console's charts and the control plane's
/metrics histograms carry on. On a host without an NVIDIA GPU, NVML or `pynvml`, nothing is
sampled, nothing is added and nothing is logged.

`SlowdownWatch` turns the samples into a diagnosis: a job whose tokens/s stays below half its
expected rate (the planner's estimate where the spec carries one, else the median of its own
first measured steps) for `sustained_s` gets one warning event naming the likely cause — the GPU
waiting on the data loader (low utilisation), no memory headroom, or throttling (NVML's clock
throttle reasons, or a hot GPU) — and another only after it recovered and fell again.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# NVML clock throttle reasons (nvml.h): the ones that mean the GPU slowed itself down
_THROTTLE_REASONS = {
    0x0000000000000004: "power cap (software)",
    0x0000000000000008: "hardware slowdown",
    0x0000000000000020: "thermal (software)",
    0x0000000000000040: "thermal (hardware)",
    0x0000000000000080: "power brake (hardware)",
}
HOT_C = 85.0
GPU_ROW_KEYS = ("gpu_utilization", "gpu_memory_used_mb", "gpu_memory_peak_mb", "gpu_power_w", "gpu_temperature_c")


@dataclass
class Reading:
    utilization: float  # 0-1
    memory_used_mb: float
    memory_total_mb: float
    power_w: float | None
    temperature_c: float | None
    throttle: int  # NVML clock throttle reasons, a bit set


@dataclass
class Window:
    """The samples since the previous step, summarised."""

    samples: int
    utilization: float
    memory_used_mb: float
    memory_total_mb: float
    memory_peak_mb: float
    power_w: float | None
    temperature_c: float | None
    throttle: int

    def row(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gpu_utilization": round(self.utilization, 4),
                                "gpu_memory_used_mb": round(self.memory_used_mb, 1),
                                "gpu_memory_peak_mb": round(self.memory_peak_mb, 1)}
        if self.power_w is not None:
            data["gpu_power_w"] = round(self.power_w, 1)
        if self.temperature_c is not None:
            data["gpu_temperature_c"] = round(self.temperature_c, 1)
        return data


def _physical_index(visible_index: int, visible: str | None) -> int | str:
    """NVML's index (or UUID) of the GPU torch calls cuda:`visible_index` under
    CUDA_VISIBLE_DEVICES `visible` (NVML numbers every GPU of the host)."""
    if not visible:
        return visible_index
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if visible_index >= len(entries):
        return visible_index
    entry = entries[visible_index]
    return int(entry) if entry.isdigit() else entry


class GpuSampler:
    """Samples one GPU through NVML on a daemon thread; `window()` summarises since the last call."""

    def __init__(self, nvml: Any, handle: Any, *, interval_s: float = 2.0) -> None:
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self._lock = threading.Lock()
        self._readings: list[Reading] = []
        self._last: Reading | None = None
        self._peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)

    @classmethod
    def open(cls, device_index: int, *, nvml: Any = None, interval_s: float = 2.0,
             visible: str | None = None) -> GpuSampler | None:
        """A started sampler of cuda:`device_index`, or None where NVML cannot be used (quietly:
        a CPU host has no NVML, and that is not news)."""
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return None
        try:
            nvml.nvmlInit()
            physical = _physical_index(device_index, visible if visible is not None
                                       else os.environ.get("CUDA_VISIBLE_DEVICES"))
            handle = (nvml.nvmlDeviceGetHandleByUUID(physical) if isinstance(physical, str)
                      else nvml.nvmlDeviceGetHandleByIndex(physical))
        except Exception as exc:  # noqa: BLE001 - NVML's own errors: no GPU, no driver
            log.debug("no GPU telemetry: %s", exc)
            return None
        sampler = cls(nvml, handle, interval_s=interval_s)
        sampler.sample()  # the first reading now: a short step still gets one
        sampler._thread.start()
        return sampler

    def read(self) -> Reading:
        nvml, handle = self.nvml, self.handle
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        power = temperature = None
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
        except Exception:  # noqa: BLE001 - not every board reports power
            pass
        try:
            temperature = float(nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))
        except Exception:  # noqa: BLE001
            pass
        try:
            throttle = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        except Exception:  # noqa: BLE001
            throttle = 0
        return Reading(utilization=utilization.gpu / 100.0, memory_used_mb=memory.used / 2**20,
                       memory_total_mb=memory.total / 2**20, power_w=power, temperature_c=temperature,
                       throttle=throttle)

    def sample(self) -> None:
        try:
            reading = self.read()
        except Exception as exc:  # noqa: BLE001 - a reading that fails is skipped, never the step
            log.debug("GPU reading failed: %s", exc)
            return
        with self._lock:
            self._readings.append(reading)
            del self._readings[:-1000]  # bounded, whatever the step time
            self._last = reading
            self._peak_mb = max(self._peak_mb, reading.memory_used_mb)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def window(self) -> Window | None:
        """The readings since the previous call (or the last one, when none came since)."""
        with self._lock:
            readings, self._readings = self._readings, []
            if not readings and self._last is not None:
                readings = [self._last]
            peak = self._peak_mb
        if not readings:
            return None
        powers = [r.power_w for r in readings if r.power_w is not None]
        temperatures = [r.temperature_c for r in readings if r.temperature_c is not None]
        throttle = 0
        for reading in readings:
            throttle |= reading.throttle
        return Window(samples=len(readings), utilization=statistics.fmean(r.utilization for r in readings),
                      memory_used_mb=readings[-1].memory_used_mb, memory_total_mb=readings[-1].memory_total_mb,
                      memory_peak_mb=peak, power_w=statistics.fmean(powers) if powers else None,
                      temperature_c=max(temperatures) if temperatures else None, throttle=throttle)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 1)
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def likely_cause(window: Window) -> str:
    """Why a GPU job runs slow, as far as its GPU's readings tell."""
    reasons = [name for bit, name in _THROTTLE_REASONS.items() if window.throttle & bit]
    if reasons or (window.temperature_c is not None and window.temperature_c >= HOT_C):
        hot = f", {window.temperature_c:.0f} °C" if window.temperature_c is not None else ""
        return f"the GPU is throttling ({', '.join(reasons) or 'hot'}{hot})"
    if window.memory_total_mb and window.memory_used_mb >= 0.95 * window.memory_total_mb:
        return (f"no memory headroom ({window.memory_used_mb:.0f} of {window.memory_total_mb:.0f} MiB used): the "
                "allocator is likely freeing and retrying; a smaller micro-batch or activation checkpointing helps")
    if window.utilization < 0.5:
        return (f"the GPU is idle much of the time ({window.utilization:.0%} busy): the data loader or the host "
                "cannot keep up (more data workers, or packed data)")
    return f"nothing in the GPU's readings ({window.utilization:.0%} busy, memory and clocks normal)"


@dataclass
class SlowdownWatch:
    """Warns once per slow spell: tokens/s below `ratio` x the expected rate for `sustained_s`."""

    expected_tps: float | None = None  # the planner's estimate; None: learned from the first steps
    ratio: float = 0.5
    sustained_s: float = 120.0
    learn_steps: int = 5
    skip_steps: int = 2  # the first steps compile and warm caches
    clock: Callable[[], float] = time.monotonic
    _seen: list[float] = field(default_factory=list)
    _slow_since: float | None = None
    _warned: bool = False

    def observe(self, tokens_per_second: float, window: Window | None) -> str | None:
        """The warning to report after this step, if this step makes one due."""
        self._seen.append(tokens_per_second)
        expected = self.expected_tps
        if expected is None:
            learned = self._seen[self.skip_steps:self.skip_steps + self.learn_steps]
            if len(learned) < self.learn_steps:
                return None
            expected = statistics.median(learned)
        now = self.clock()
        if tokens_per_second >= self.ratio * expected:
            self._slow_since, self._warned = None, False
            return None
        if self._slow_since is None:
            self._slow_since = now
        if self._warned or now - self._slow_since < self.sustained_s:
            return None
        self._warned = True
        cause = likely_cause(window) if window is not None else "no GPU readings to tell"
        return (f"training runs at {tokens_per_second:,.0f} tokens/s, below half the expected {expected:,.0f} "
                f"for {now - self._slow_since:.0f} s; likely cause: {cause}")
