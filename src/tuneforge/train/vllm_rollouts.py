"""Reinforcement rollouts on vLLM, on a GPU trainer where the `vllm` package is installed.

The operator turns it on with `TUNEFORGE_RFT_VLLM_GPU_MEMORY` (`JobSpec.rollout_vllm_memory`):
the fraction of the GPU's memory the trainer gives an in-process vLLM engine for the job's base
model (0, the default: the trainer samples itself, `train/sampling.py`). It is used where it can
give the policy's own samples: a LoRA job (each step's adapter is what vLLM applies) on one
process (not DDP or FSDP ranks: every rank would hold an engine), on CUDA, without a
`response_format` (the trainer's sampler constrains JSON itself); anywhere else the trainer's
sampler runs and the reason is logged once.

Each step the adapter being trained is saved to the attempt's scratch folder and handed to vLLM
as a new LoRA request (the previous step's files are removed); every row gets its own seed
drawn from the step's generator, so a resumed attempt asks vLLM for the same samples (vLLM's
sampling is reproducible per seed on the same GPU and version, not bit-identical across them).
The engine is created once per attempt, at the first step. The planner does not count the
engine's memory: the fraction is the operator's to size against the jobs it runs.

Only the glue runs on this project's CI (with a stand-in for the `vllm` module,
`tests/unit/train/test_vllm_rollouts.py`); the engine itself needs an NVIDIA GPU.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import weakref
from pathlib import Path
from typing import Any

import torch

from tuneforge.train.sampling import Completions

log = logging.getLogger(__name__)

MAX_SEED = 2**31 - 1


def unavailable(spec: Any, device: torch.device, *, world_size: int, response_format: bool) -> str | None:
    """Why rollouts cannot run on vLLM here (None: they can)."""
    if spec.rollout_vllm_memory <= 0:
        return "off (TUNEFORGE_RFT_VLLM_GPU_MEMORY is 0)"
    if device.type != "cuda":
        return "the trainer has no CUDA GPU"
    if spec.training_type != "lora":
        return f"a {spec.training_type} job (vLLM applies a LoRA adapter each step)"
    if world_size > 1:
        return "a job on several processes"
    if response_format:
        return "a response_format (the trainer's sampler constrains the JSON)"
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed on the trainer"
    return None


class VllmRollouts:
    """One attempt's vLLM engine and the adapters it has been handed (see the module's docstring)."""

    def __init__(self, spec: Any, base_dir: Path, scratch: Path, *, lora_rank: int, max_model_len: int) -> None:
        self.spec = spec
        self.base_dir = base_dir
        self.scratch = scratch
        self.lora_rank = lora_rank
        self.max_model_len = max_model_len
        self.engine: Any = None
        self.requests = 0
        self.previous: Path | None = None
        weakref.finalize(self, shutil.rmtree, str(scratch), True)  # the attempt's adapters, at its end

    def _engine(self) -> Any:
        if self.engine is None:
            import vllm

            self.engine = vllm.LLM(
                model=str(self.base_dir), tokenizer=str(self.base_dir), enable_lora=True, max_loras=1,
                max_lora_rank=_supported_rank(self.lora_rank), gpu_memory_utilization=self.spec.rollout_vllm_memory,
                max_model_len=self.max_model_len, seed=self.spec.seed, dtype="auto")
        return self.engine

    def sample(self, model: Any, prompts: list[list[int]], *, max_new_tokens: int, temperature: float,
               eos_ids: set[int], generator: torch.Generator) -> Completions:
        """A completion of each prompt from the policy as it is now (its adapter saved and applied)."""
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        from tuneforge.train.distributed import unwrap

        engine = self._engine()
        self.requests += 1
        folder = self.scratch / f"rollout-adapter-{self.requests}"
        unwrap(model).save_pretrained(str(folder))
        seeds = torch.randint(0, MAX_SEED, (len(prompts),), generator=generator, device=generator.device).tolist()
        params = [SamplingParams(n=1, temperature=temperature, max_tokens=max_new_tokens, seed=int(seed),
                                 stop_token_ids=sorted(eos_ids), skip_special_tokens=False) for seed in seeds]
        outputs = engine.generate([{"prompt_token_ids": list(prompt)} for prompt in prompts], params,
                                  lora_request=LoRARequest(f"policy-{self.requests}", self.requests, str(folder)),
                                  use_tqdm=False)
        if self.previous is not None:
            shutil.rmtree(self.previous, ignore_errors=True)
        self.previous = folder
        token_ids, stopped = [], []
        for output in outputs:
            sampled = output.outputs[0]
            ids = [int(token) for token in sampled.token_ids]
            ended = sampled.finish_reason == "stop"
            if ended and (not ids or ids[-1] not in eos_ids):  # a stop token vLLM left out of the output
                ids.append(sampled.stop_reason if isinstance(sampled.stop_reason, int) else min(eos_ids))
            token_ids.append(ids[:max_new_tokens + 1])
            stopped.append(ended)
        return Completions(token_ids, stopped)

    def close(self) -> None:
        if self.previous is not None:
            shutil.rmtree(self.previous, ignore_errors=True)
        self.engine = None


def _supported_rank(rank: int) -> int:
    """The smallest LoRA rank vLLM is built for that holds `rank`."""
    for supported in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= supported:
            return supported
    return rank
