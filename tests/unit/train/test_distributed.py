"""Data-parallel training in two real processes (gloo on CPU), as the executor runs it:
`python -m tuneforge.train SPEC` with `gpus: 2` starts a second rank itself.

- Two ranks compute the same steps as one process (each takes half of every
  step's examples; gradients are summed): per-step losses and the final adapter
  agree to floating-point tolerance (no dropout, so no RNG difference).
- A two-rank attempt stopped at a step and resumed by another two-rank attempt
  gives bit-identical per-step losses and adapter to an uninterrupted two-rank
  run, with dropout on: each rank's RNG state is in the checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import safetensors.torch
import torch

import tuneforge
from tests.helpers.fake_control_plane import FakeControlPlane
from tests.helpers.tiny import next_attempt, stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout

OPTIONS = {"hyperparameters": {"n_epochs": 2, "batch_size": 6, "micro_batch_size": 2, "warmup_ratio": 0.0},
           "checkpoint": {"every_steps": 2, "keep_last": 5}}


def _run(spec, path: Path) -> tuple[int, dict[int, float], str]:
    """Run one attempt as the executor does; its return code and the losses it reported."""
    with FakeControlPlane() as plane:
        spec = replace(spec, callback_url=plane.url)
        spec.write(path)
        src = str(Path(tuneforge.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-m", "tuneforge.train", str(path)], env=env,
                              capture_output=True, text=True, timeout=300)
        losses = {e["data"]["step"]: e["data"]["train_loss"] for e in plane.accepted_events() if e["type"] == "metrics"}
    return done.returncode, losses, done.stderr


def _adapter(store, spec) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    return safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))


def test_two_ranks_train_the_same_steps_as_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    one, store1 = stage_job(tmp_path / "one", tiny_model_dir, lora={"dropout": 0.0}, **OPTIONS)
    code, single, err = _run(replace(one, gpus=1), tmp_path / "one.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    two, store2 = stage_job(tmp_path / "two", tiny_model_dir, lora={"dropout": 0.0}, **OPTIONS)
    code, double, err = _run(replace(two, gpus=2), tmp_path / "two.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert "rank 0 of 2 joined (gloo)" in err and "rank 1 of 2 joined (gloo)" in err
    assert double.keys() == single.keys() and len(single) == 2 * 2  # 12 examples, 6 a step, 2 epochs
    for step in single:
        assert abs(double[step] - single[step]) <= 1e-4 * abs(single[step]), step
    a, b = _adapter(store1, one), _adapter(store2, two)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4) for k in a)


def test_a_two_rank_attempt_resumes_exactly(tmp_path: Path, tiny_model_dir: Path) -> None:
    whole, store = stage_job(tmp_path / "whole", tiny_model_dir, lora={"dropout": 0.1}, **OPTIONS)
    code, reference, err = _run(replace(whole, gpus=2), tmp_path / "whole.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]

    first, store2 = stage_job(tmp_path / "split", tiny_model_dir, lora={"dropout": 0.1},
                              extra={"stop_after_step": 3}, **OPTIONS)
    first = replace(first, gpus=2)
    code, before, err = _run(first, tmp_path / "first.json")
    assert code == TrainerExit.PREEMPTED, err[-3000:]
    assert max(before) == 3
    rng = torch.load(__import__("io").BytesIO(store2.get_bytes(
        f"{layout.checkpoint_prefix(first.tenant_id, first.job_id, 3)}/rng_state.pt")), weights_only=True)
    assert len(rng["ranks"]) == 2 and not torch.equal(rng["ranks"][0]["torch"], rng["ranks"][1]["torch"])
    code, after, err = _run(next_attempt(first), tmp_path / "second.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert min(after) == 4
    assert {**before, **after} == reference  # bit for bit
    a, b = _adapter(store, whole), _adapter(store2, first)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
