"""Placement by GPU hardware: what nodes report (local settings, NVML, Ray labels and resources),
the matching rule, and the policy placing a job only where its GPUs' type and memory fit."""

from __future__ import annotations

import sys
import types
from dataclasses import replace

import pytest

from tuneforge.executors.local import GpuHardware, local_inventory, read_nvml
from tuneforge.executors.ray import node_hardware
from tuneforge.planning.hardware import GpuAsk, NodeHardware, nominal_gb, planning_memory_gb, why_nowhere
from tuneforge.planning.policy import Node, QueuedJob, RunningJob, choose_victims, place, plan
from tuneforge.settings import Settings


def job(job_id="j", gpus=1, memory_gb=0.0, gpu_type="", per_node=0):
    return QueuedJob(job_id, "t1", "standard", gpus, 0.0, 600.0, per_node, hardware=GpuAsk.parse(gpu_type, memory_gb))


def fleet():
    """A 24 GB L4 node with the most free GPUs, a 40 GB A100 and an 80 GB H100, each with 4 free."""
    return [Node("node-a", 8, set(range(8)), gpu_model="NVIDIA L4", gpu_memory_gb=22.5),
            Node("node-b", 4, set(range(4)), gpu_model="NVIDIA A100-SXM4-40GB", gpu_memory_gb=39.4),
            Node("node-c", 4, set(range(4)), gpu_model="NVIDIA H100 80GB HBM3", gpu_memory_gb=79.6)]


def test_names_match_by_family_and_memory_suffix_whatever_the_case_spaces_or_dashes():
    assert GpuAsk.parse("a100-80gb") == GpuAsk("a100", 80.0)
    assert GpuAsk.parse("A100 80GB") == GpuAsk.parse("a100_80g") == GpuAsk("a100", 80.0)
    assert GpuAsk.parse("H100") == GpuAsk("h100", 0.0)
    assert GpuAsk.parse("default") == GpuAsk.parse(None) == GpuAsk()
    assert GpuAsk.parse("a100-40gb", 70.0).memory_gb == 70.0  # the larger of the two
    ask = GpuAsk.parse("a100-80gb")
    assert ask.fits("NVIDIA A100-SXM4-80GB", 79.2)  # NVML's usable GiB counts as the nominal 80
    assert not ask.fits("NVIDIA A100-SXM4-40GB", 39.4)
    assert not ask.fits("NVIDIA H100 80GB HBM3", 79.6)  # another family
    assert ask.fits("A100-80G", 0.0) and not ask.fits("A100-40G", 0.0)  # memory unknown: the name says it
    assert ask.fits("", 0.0)  # a node that reports nothing takes any job
    assert GpuAsk.parse("l4-24gb").fits("NVIDIA L4", 22.5)  # 23034 MiB is NVIDIA's "24GB"


def test_a_computed_need_in_gib_is_held_exactly_not_with_the_nominal_slack():
    need = GpuAsk(memory_gb=nominal_gb(39.5))  # the memory model says 39.5 GiB a GPU
    assert not need.fits("NVIDIA A100-SXM4-40GB", 39.4) and need.fits("NVIDIA A100-SXM4-80GB", 79.2)
    assert GpuAsk(memory_gb=nominal_gb(22.5)).fits("NVIDIA L4", 22.5)  # planned for the L4: it fits the L4


def test_a_job_needing_more_memory_than_a_node_has_goes_to_one_with_enough():
    nodes = fleet()
    assert place(job(memory_gb=0.0), nodes) == {"node-b": (0,)}  # any GPU: the fullest node that fits
    assert place(job(memory_gb=35.0), nodes) == {"node-b": (0,)}  # not the 24 GB L4s
    assert place(job(memory_gb=70.0), nodes) == {"node-c": (0,)}  # only the 80 GB node
    assert place(job(gpu_type="a100"), nodes) == {"node-b": (0,)}
    assert place(job(gpu_type="h100", gpus=4), nodes) == {"node-c": (0, 1, 2, 3)}
    assert place(job(memory_gb=70.0, gpus=8), nodes) is None  # the 8-GPU node is too small a GPU
    assert place(job(memory_gb=100.0), nodes) is None


def test_without_the_memory_rule_a_70_gb_job_would_land_on_a_small_gpu():
    nodes = fleet()
    assert place(job(gpus=8), nodes) == {"node-a": tuple(range(8))}
    assert place(job(gpus=8, memory_gb=70.0), nodes) is None


def test_nodes_that_report_no_hardware_take_any_job():
    nodes = [Node("old", 2, {0, 1})]
    assert place(job(memory_gb=70.0, gpu_type="h100"), nodes) == {"old": (0,)}


def test_plan_backfills_past_a_job_waiting_for_big_gpus_and_victims_come_from_matching_nodes():
    nodes = fleet()
    nodes[2].free.clear()  # the H100 node is busy
    result = plan([job("big", memory_gb=70.0), job("small")], nodes, [], 0.0)
    assert result.blocked is not None and result.blocked.job_id == "big"
    assert [(j.job_id, a) for j, a in result.starts] == [("small", {"node-b": (0,)})]
    on_l4 = RunningJob("l4", "t9", "free", {"node-a": (0,)}, 0.0, 900.0, 0.0)
    on_h100 = RunningJob("h100", "t9", "free", {"node-c": (0, 1, 2, 3)}, 0.0, 900.0, 0.0)
    premium = QueuedJob("p", "t1", "premium", 1, 0.0, 600.0, hardware=GpuAsk(memory_gb=70.0))
    assert choose_victims(premium, nodes, [on_l4, on_h100], 0.0) == [on_h100]


def test_a_job_that_fits_nowhere_is_explained_with_the_field_and_what_exists():
    nodes = [NodeHardware("node-a", "NVIDIA L4", 22.5), NodeHardware("node-b", "NVIDIA L4", 22.5)]
    param, why = why_nowhere(GpuAsk(memory_gb=70.0), nodes)
    assert param == "resources.gpu_memory_gb"
    assert why == "needs 70 GB per GPU; the largest GPUs here have 22.5 GB (node-a: NVIDIA L4, node-b: NVIDIA L4)"
    param, why = why_nowhere(GpuAsk.parse("h100"), nodes)
    assert param == "resources.gpu_type" and "NVIDIA L4" in why and "'h100'" in why
    assert why_nowhere(GpuAsk(memory_gb=20.0), nodes) is None
    assert why_nowhere(GpuAsk(memory_gb=70.0), [NodeHardware("unknown")]) is None  # nothing reported: no judgement
    assert planning_memory_gb(GpuAsk(), nodes + [NodeHardware("c", "NVIDIA H100", 79.6)]) == 22.5
    assert planning_memory_gb(GpuAsk.parse("h100"), nodes + [NodeHardware("c", "NVIDIA H100", 79.6)]) == 79.6
    assert planning_memory_gb(GpuAsk(), [NodeHardware("unknown")]) is None


def test_the_local_executor_reports_the_settings_hardware_else_nvmls(tmp_path):
    asked = []

    def fake_nvml(devices):
        asked.append(devices)
        return GpuHardware("NVIDIA L4", 22.5)

    configured = Settings(home=tmp_path, local_gpus=2, local_nodes=2, local_gpu_model="NVIDIA A100-SXM4-80GB",
                          local_gpu_memory_gb=80, local_interconnect="nvlink")
    nodes = local_inventory(configured, nvml=fake_nvml).nodes
    assert [(n.name, n.gpu_model, n.gpu_memory_gb, n.interconnect) for n in nodes] == [
        ("local", "NVIDIA A100-SXM4-80GB", 80.0, "nvlink"), ("local-1", "NVIDIA A100-SXM4-80GB", 80.0, "nvlink")]
    assert asked == []  # both set: NVML is not asked
    read = local_inventory(Settings(home=tmp_path, local_gpus=2), nvml=fake_nvml).nodes[0]
    assert (read.gpu_model, read.gpu_memory_gb, read.interconnect) == ("NVIDIA L4", 22.5, "")
    assert asked == [2]
    slots = local_inventory(Settings(home=tmp_path, local_gpus=0), nvml=fake_nvml).nodes[0]
    assert (slots.gpu_model, slots.gpu_memory_gb) == ("", 0.0)  # no slots: nothing to read


def test_nvml_is_read_for_the_first_devices_and_its_absence_is_unknown(monkeypatch):
    fake = types.ModuleType("pynvml")
    memory = {0: 80 * 2**30, 1: 40 * 2**30, 2: 10 * 2**30}
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 3
    fake.nvmlDeviceGetHandleByIndex = lambda index: index
    fake.nvmlDeviceGetName = lambda handle: b"NVIDIA A100-SXM4-80GB"
    fake.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=memory[handle])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    read_nvml.cache_clear()
    assert read_nvml(2) == GpuHardware("NVIDIA A100-SXM4-80GB", 40.0)  # the smallest of the two slots

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = no_driver
    read_nvml.cache_clear()
    assert read_nvml(2) == GpuHardware()
    read_nvml.cache_clear()


def test_ray_nodes_report_hardware_from_labels_and_resources():
    labelled = {"NodeID": "a", "Alive": True, "Resources": {"GPU": 8.0, "accelerator_type:A100": 1.0},
                "Labels": {"tuneforge.io/gpu-model": "NVIDIA A100-SXM4-80GB", "tuneforge.io/gpu-memory-gb": "80",
                           "tuneforge.io/interconnect": "nvlink"}}
    assert node_hardware(labelled) == ("NVIDIA A100-SXM4-80GB", 80.0, "nvlink")
    by_ray = {"Resources": {"GPU": 4.0, "accelerator_type:A100-40G": 1.0, "tuneforge_gpu_memory_gb": 40.0}}
    assert node_hardware(by_ray) == ("A100-40G", 40.0, "")
    ray_label = {"Resources": {"GPU": 1.0}, "Labels": {"ray.io/accelerator-type": "L4",
                                                       "tuneforge.io/gpu-memory-gb": "not a number"}}
    assert node_hardware(ray_label) == ("L4", 0.0, "")
    assert node_hardware({"Resources": {"CPU": 4.0}}) == ("", 0.0, "")


def test_the_ray_executor_capacity_carries_the_hardware(monkeypatch):
    from tuneforge.executors.ray import RayExecutor

    executor = RayExecutor.__new__(RayExecutor)
    executor.settings = Settings(ray_gpu_resource="GPU")
    executor._ray = types.SimpleNamespace(nodes=lambda: [
        {"NodeID": "n2", "Alive": True, "Resources": {"GPU": 4.0, "accelerator_type:H100": 1.0},
         "Labels": {"tuneforge.io/gpu-memory-gb": "80"}},
        {"NodeID": "n1", "Alive": True, "Resources": {"GPU": 2.0, "accelerator_type:L4": 1.0,
                                                       "tuneforge_gpu_memory_gb": 24.0}},
        {"NodeID": "cpu", "Alive": True, "Resources": {"CPU": 8.0}}])
    monkeypatch.setattr(executor, "_available_per_node", lambda: None)
    monkeypatch.setattr(executor, "_draining_nodes", lambda: set())
    nodes = executor.capacity().nodes
    assert [(n.name, n.total_gpus, n.gpu_model, n.gpu_memory_gb) for n in nodes] == [
        ("n1", 2, "L4", 24.0), ("n2", 4, "H100", 80.0)]


def test_the_need_per_gpu_follows_the_memory_model_the_micro_batch_and_sharding(tmp_path):
    from tuneforge.domain.job_config import JobRequest
    from tuneforge.planning import memory
    from tuneforge.services.training.planning import per_gpu_need_gb, resolve_resources

    llama_8b = memory.ModelShape.from_config({
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256})
    base = types.SimpleNamespace(num_parameters=8_000_000_000, size_bytes=0)
    settings = Settings(home=tmp_path, gpu_memory_gb=80, gpus_per_node=8)
    request = JobRequest(model="m", training_file="file-x")
    lora = resolve_resources(settings, request, base, "lora", llama_8b, seq_len=2048)
    full = resolve_resources(settings, request, base, "full", llama_8b, seq_len=2048)
    assert lora.gpus == 1 and full.strategy == "fsdp" and full.gpus > 1

    def need(training_type, resources, micro):
        return per_gpu_need_gb(base, training_type, resources, llama_8b, micro_batch_size=micro, seq_len=2048,
                               lora_rank=16)

    one, four = need("lora", lora, 1), need("lora", lora, 4)
    assert 16 < one <= 80 < four  # bf16 weights of 8B parameters and more; micro-batch 4 would not fit 80 GB
    sharded = need("full", full, 1)
    unsharded = per_gpu_need_gb(base, "full", replace(full, strategy="ddp"), llama_8b, micro_batch_size=1,
                                seq_len=2048, lora_rank=16)
    assert sharded < 80 < unsharded  # FSDP over its GPUs fits an 80 GB GPU; one copy per GPU would not
    no_shape = per_gpu_need_gb(base, "lora", lora, None, micro_batch_size=1, seq_len=2048, lora_rank=16)
    assert no_shape == pytest.approx(8e9 * 2 / 1e9 / 0.7)  # the bytes-per-parameter rule
