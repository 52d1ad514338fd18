"""GPU telemetry (train/gpu_telemetry.py) from a fake NVML, and its absence without one."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from tuneforge import prometheus
from tuneforge.domain.metrics import metrics_data
from tuneforge.train import loop
from tuneforge.train.gpu_telemetry import GpuSampler, SlowdownWatch, Window, likely_cause
from tuneforge.train.run import StepStats

MIB = 2**20


class FakeNvml:
    """The part of pynvml the sampler calls, answering from `readings` (one per call, the last
    repeated) for the GPU at `index` or with `uuid`."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, readings: list[dict], *, index: int = 0, uuid: str = "GPU-abc", fail_init: bool = False):
        self.readings, self.index, self.uuid, self.fail_init = readings, index, uuid, fail_init
        self.calls = 0
        self.shut = False
        self.handles: list[object] = []

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.fail_init:
            raise OSError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        assert index == self.index, f"asked for GPU {index}, the fake is {self.index}"
        self.handles.append(("index", index))
        return "handle"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:  # noqa: N802
        assert uuid == self.uuid
        self.handles.append(("uuid", uuid))
        return "handle"

    def _now(self) -> dict:
        reading = self.readings[min(self.calls, len(self.readings) - 1)]
        return reading

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:  # noqa: N802
        reading = self._now()
        return SimpleNamespace(used=reading["used_mb"] * MIB, total=reading.get("total_mb", 81559) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self._now()["util"], memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:  # noqa: N802
        return self._now()["power_mw"]

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:  # noqa: N802
        return self._now()["temp"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:  # noqa: N802
        reading = self._now()
        self.calls += 1  # the last call of a reading
        return reading.get("throttle", 0)


READINGS = [
    {"util": 90, "used_mb": 30000, "power_mw": 600_000, "temp": 61},
    {"util": 70, "used_mb": 42000, "power_mw": 500_000, "temp": 66, "throttle": 0x20},
    {"util": 80, "used_mb": 36000, "power_mw": 400_000, "temp": 64},
]


def test_without_nvml_there_is_no_sampler_and_nothing_is_logged(caplog) -> None:
    caplog.set_level(logging.INFO)
    assert GpuSampler.open(0, nvml=FakeNvml(READINGS, fail_init=True)) is None
    assert GpuSampler.open(0) is None  # this host: pynvml is installed, the driver's library is not
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_readings_are_summarised_per_step_with_units_and_the_attempts_peak() -> None:
    nvml = FakeNvml(READINGS)
    sampler = GpuSampler.open(0, nvml=nvml, interval_s=3600, visible="")  # no thread samples during the test
    assert sampler is not None
    try:
        sampler.sample()
        sampler.sample()
        window = sampler.window()
        assert window is not None and window.samples == 3
        assert window.utilization == pytest.approx(0.8)
        assert window.memory_used_mb == pytest.approx(36000)  # the newest
        assert window.memory_peak_mb == pytest.approx(42000)  # the attempt's highest
        assert window.power_w == pytest.approx(500.0)  # milliwatts to watts, the mean
        assert window.temperature_c == 66  # the highest
        assert window.throttle == 0x20
        assert window.row() == {"gpu_utilization": 0.8, "gpu_memory_used_mb": 36000.0, "gpu_memory_peak_mb": 42000.0,
                                "gpu_power_w": 500.0, "gpu_temperature_c": 66.0}
        again = sampler.window()  # no new reading: the last one stands, the peak stays
        assert again is not None and again.samples == 1 and again.memory_peak_mb == pytest.approx(42000)
    finally:
        sampler.close()
    assert nvml.shut


@pytest.mark.parametrize(("visible", "device", "expected"), [
    (None, 1, ("index", 1)), ("3,1", 1, ("index", 1)), ("3,1", 0, ("index", 3)), ("GPU-abc", 0, ("uuid", "GPU-abc")),
])
def test_the_sampled_gpu_is_the_one_torch_uses_under_cuda_visible_devices(visible, device, expected) -> None:
    nvml = FakeNvml(READINGS, index=expected[1] if expected[0] == "index" else 0)
    sampler = GpuSampler.open(device, nvml=nvml, interval_s=3600, visible=visible or "")
    assert sampler is not None
    sampler.close()
    assert nvml.handles == [expected]


def _window(**overrides) -> Window:
    fields = {"samples": 5, "utilization": 0.95, "memory_used_mb": 40000.0, "memory_total_mb": 81559.0,
              "memory_peak_mb": 41000.0, "power_w": 650.0, "temperature_c": 70.0, "throttle": 0}
    return Window(**{**fields, **overrides})


def test_the_likely_cause_of_a_slow_spell() -> None:
    assert "data loader" in likely_cause(_window(utilization=0.2))
    assert "throttling (thermal (hardware), 91 °C)" in likely_cause(_window(throttle=0x40, temperature_c=91.0))
    assert "throttling (hot, 88 °C)" in likely_cause(_window(temperature_c=88.0))
    assert "no memory headroom (79000 of 81559 MiB used)" in likely_cause(_window(memory_used_mb=79000.0))
    assert likely_cause(_window()).startswith("nothing in the GPU's readings")


def test_a_sustained_slow_spell_warns_once_naming_its_cause_and_rearms_after_recovery() -> None:
    now = [0.0]
    watch = SlowdownWatch(sustained_s=120, clock=lambda: now[0])
    said = []
    for tps in [100, 500, 1000, 1010, 990, 1000, 1005]:  # two warm-up steps, then the baseline (median 1000)
        said.append(watch.observe(tps, _window()))
        now[0] += 10
    for _ in range(12):  # 400 tokens/s for 120 s and more
        said.append(watch.observe(400, _window(utilization=0.3)))
        now[0] += 11
    warnings = [s for s in said if s]
    assert len(warnings) == 1
    assert warnings[0].startswith("training runs at 400 tokens/s, below half the expected 1,000 for 121 s")
    assert "data loader" in warnings[0]
    assert watch.observe(990, _window()) is None  # recovered
    for _ in range(13):
        said.append(watch.observe(300, _window(throttle=0x4)))
        now[0] += 11
    assert len([s for s in said if s]) == 2 and "power cap" in [s for s in said if s][-1]
    # a spell shorter than sustained_s says nothing
    short = SlowdownWatch(expected_tps=1000, sustained_s=120, clock=lambda: now[0])
    for _ in range(5):
        assert short.observe(100, None) is None
        now[0] += 20
    assert short.observe(1000, None) is None


class _Reporter:
    def __init__(self) -> None:
        self.reports: list[tuple[str, dict]] = []

    def report(self, kind: str, body: dict) -> int:
        self.reports.append((kind, body))
        return 1


def test_a_steps_metrics_carry_the_gpu_readings_to_the_event_and_to_metrics() -> None:
    nvml = FakeNvml(READINGS)
    sampler = GpuSampler.open(0, nvml=nvml, interval_s=3600, visible="")
    reporter = _Reporter()
    run = SimpleNamespace(gpu=sampler, slowdown=SlowdownWatch(), reporter=reporter, num_parameters=1000,
                          device=torch.device("cpu"), spec=SimpleNamespace(gpus=1))
    stats = StepStats(train_loss=1.0, train_accuracy=0.5, grad_norm=1.0, learning_rate=1e-4, num_tokens=1000,
                      elapsed_s=1.0, num_slots=1000)
    try:
        data = loop.telemetry(run, stats)  # type: ignore[arg-type]
    finally:
        sampler.close()
    assert data["gpu_utilization"] == 0.9 and data["gpu_power_w"] == 600.0 and data["gpu_temperature_c"] == 61.0
    event = metrics_data({"step": 1, "train_loss": 1.0, **data}, 10)
    assert event["gpu_memory_used_mb"] == 30000.0 and event["gpu_memory_peak_mb"] == 30000.0

    before = prometheus.GPU_UTILIZATION.collect()[0].samples
    count = next(s.value for s in before if s.name.endswith("_count"))
    prometheus.observe_gpu(event)
    prometheus.observe_gpu({"gpu_utilization": "busy"})  # free-form data that is not a number: skipped
    after = prometheus.GPU_UTILIZATION.collect()[0].samples
    assert next(s.value for s in after if s.name.endswith("_count")) == count + 1

    cpu_run = SimpleNamespace(gpu=None, slowdown=None, reporter=reporter, num_parameters=1000,
                              device=torch.device("cpu"), spec=SimpleNamespace(gpus=1))
    assert not [key for key in loop.telemetry(cpu_run, stats) if key.startswith("gpu_")]  # type: ignore[arg-type]
