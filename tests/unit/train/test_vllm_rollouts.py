"""Reinforcement rollouts on vLLM (train/vllm_rollouts.py), against a stand-in for the `vllm` module: the
engine is made once, each step's adapter is saved and applied, each row has its own seed from the step's
generator, stop tokens end a completion as the trainer's own sampler ends it. (The engine itself needs
an NVIDIA GPU.)"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tuneforge.train import vllm_rollouts


@dataclass
class Output:
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | None = None


class Engine:
    made: list[dict[str, Any]] = []

    def __init__(self, **options: Any) -> None:
        Engine.made.append(options)
        self.calls: list[tuple[list[dict], list[Any], Any]] = []

    def generate(self, prompts: list[dict], params: list[Any], *, lora_request: Any, use_tqdm: bool) -> list[Any]:
        assert Path(lora_request.path, "adapter_config.json").exists()  # saved before it is asked for
        self.calls.append((prompts, params, lora_request))
        outputs = []
        for prompt, sampling in zip(prompts, params):
            head = prompt["prompt_token_ids"][0]
            if head == 1:  # ends with the end-of-sequence token, which vLLM reports in the output
                out = Output([7, 8, 2], "stop")
            elif head == 3:  # a stop token vLLM left out of its output
                out = Output([9], "stop", stop_reason=5)
            else:  # the length limit
                out = Output([4] * sampling.max_tokens, "length")
            outputs.append(types.SimpleNamespace(outputs=[out]))
        return outputs


@dataclass(frozen=True)
class Sampling:
    n: int
    temperature: float
    max_tokens: int
    seed: int
    stop_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True


@dataclass(frozen=True)
class LoRARequest:
    name: str
    id: int
    path: str


class Adapter:
    def save_pretrained(self, folder: str) -> None:
        Path(folder).mkdir(parents=True)
        Path(folder, "adapter_config.json").write_text("{}")


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = Engine, Sampling
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    Engine.made = []
    return module


SPEC = types.SimpleNamespace(rollout_vllm_memory=0.3, seed=11, training_type="lora")


def test_rollouts_apply_each_steps_adapter_with_a_seed_per_row(fake_vllm, tmp_path: Path) -> None:
    rollouts = vllm_rollouts.VllmRollouts(SPEC, tmp_path / "base", tmp_path / "scratch", lora_rank=12,
                                          max_model_len=512)
    prompts = [[1, 10], [1, 10], [3, 11], [6, 12]]
    first = rollouts.sample(Adapter(), prompts, max_new_tokens=4, temperature=0.9, eos_ids={2, 5},
                            generator=torch.Generator().manual_seed(3))
    assert first.token_ids == [[7, 8, 2], [7, 8, 2], [9, 5], [4, 4, 4, 4]]
    assert first.stopped == [True, True, True, False]
    (made,) = Engine.made
    assert made["enable_lora"] and made["max_lora_rank"] == 16 and made["gpu_memory_utilization"] == 0.3
    assert made["model"] == str(tmp_path / "base") and made["seed"] == 11 and made["max_model_len"] == 512
    asked, params, lora = rollouts.engine.calls[0]
    assert [p["prompt_token_ids"] for p in asked] == prompts
    assert {(p.temperature, p.max_tokens, tuple(p.stop_token_ids), p.skip_special_tokens) for p in params} == \
        {(0.9, 4, (2, 5), False)}
    seeds = [p.seed for p in params]
    assert len(set(seeds)) == 4  # each row its own draw, the group's rows too
    rollouts.sample(Adapter(), prompts, max_new_tokens=4, temperature=0.9, eos_ids={2, 5},
                    generator=torch.Generator().manual_seed(3))
    assert len(Engine.made) == 1  # one engine per attempt
    _asked, again, second = rollouts.engine.calls[1]
    assert [p.seed for p in again] == seeds  # the same generator state: the same seeds (an exact resume)
    assert (lora.id, second.id) == (1, 2) and not Path(lora.path).exists() and Path(second.path).exists()
    rollouts.close()
    assert not Path(second.path).exists()


@pytest.mark.parametrize("change, device, world, response_format, reason", [
    ({"rollout_vllm_memory": 0.0}, "cuda", 1, False, "off"),
    ({}, "cpu", 1, False, "no CUDA GPU"),
    ({"training_type": "full"}, "cuda", 1, False, "a full job"),
    ({}, "cuda", 2, False, "several processes"),
    ({}, "cuda", 1, True, "response_format"),
])
def test_rollouts_stay_on_the_trainer_where_vllm_cannot_give_the_policys_samples(
        change: dict[str, Any], device: str, world: int, response_format: bool, reason: str) -> None:
    spec = types.SimpleNamespace(**{**vars(SPEC), **change})
    why = vllm_rollouts.unavailable(spec, torch.device(device), world_size=world, response_format=response_format)
    assert why is not None and reason in why


def test_without_the_package_rollouts_stay_on_the_trainer(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of it fails, as where it is not installed
    monkeypatch.setattr(vllm_rollouts.importlib.util, "find_spec", lambda name: None)
    why = vllm_rollouts.unavailable(SPEC, torch.device("cuda"), world_size=1, response_format=False)
    assert why is not None and "not installed" in why
