"""Training in two real processes (gloo on CPU), as the local executor runs it: its warm
trainer forks the attempt's trainer (rank 0), which with `gpus: 2` forks the second rank
itself, in torchrun's environment (tests/unit/train/test_launch_workers.py: the same ranks
started as fresh processes).

- DDP (LoRA) and FSDP2 (full fine-tune, and LoRA sharded) compute the same steps as
  one process (each rank takes half of every step's examples; gradients are averaged
  with the loss scaled to match): per-step losses and the final weights agree to
  floating-point tolerance (no dropout, so no RNG difference).
- A two-rank attempt stopped at a step and resumed by another two-rank attempt gives
  bit-identical per-step losses and weights to an uninterrupted two-rank run, with
  dropout on: each rank's RNG state is in the checkpoint.
- 2 -> 1 -> 2: a checkpoint written by two sharded ranks resumes in one process, whose
  checkpoint resumes in two again (torch.distributed.checkpoint reshards); the steps
  match an uninterrupted run to floating-point tolerance.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import safetensors.torch
import torch

import tuneforge
from tests.helpers.fake_control_plane import FakeControlPlane
from tests.helpers.tiny import next_attempt, stage_job
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import JobSpec
from tuneforge.executors.warm import WarmTrainer
from tuneforge.storage import layout
from tuneforge.storage.store import FsspecStore
from tuneforge.train.__main__ import exit_file

pytestmark = pytest.mark.distributed

OPTIONS = {"hyperparameters": {"n_epochs": 2, "batch_size": 6, "micro_batch_size": 2, "warmup_ratio": 0.0},
           "checkpoint": {"every_steps": 2, "keep_last": 5}}


def _trainer_env() -> dict[str, str]:
    src = str(Path(tuneforge.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}


_warm: list[WarmTrainer] = []  # the module's warm trainer, while its tests run


@pytest.fixture(scope="module", autouse=True)
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The local executor's warm trainer, ready before the first attempt: every attempt here is
    forked from it, and its rank 0 forks the second rank (a cold start is trainer-level, covered
    by the executor's own tests; tests/unit/train/test_main.py runs `python -m tuneforge.train`)."""
    trainer = WarmTrainer(_trainer_env(), tmp_path_factory.mktemp("warm") / "warm.log")
    trainer.start()
    deadline = time.monotonic() + 120
    while not trainer.ready():
        assert time.monotonic() < deadline, trainer.log_path.read_text()[-3000:]
        time.sleep(0.1)
    _warm.append(trainer)
    yield
    _warm.clear()
    trainer.close()


def _run(spec, path: Path) -> tuple[int, dict[int, float], str]:
    """Run one attempt as the local executor does (forked from its warm trainer); its exit code,
    the losses it reported and its log."""
    with FakeControlPlane() as plane:
        spec = replace(spec, callback_url=plane.url)
        spec.write(path)
        log_path = path.with_suffix(".log")
        forked = _warm[0].launch(str(path), _trainer_env(), str(path.parent), str(log_path))
        assert forked is not None, _warm[0].log_path.read_text()[-3000:]
        exit_path = Path(exit_file(str(path)))
        deadline = time.monotonic() + 300
        while not exit_path.exists():
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        losses = {e["data"]["step"]: e["data"]["train_loss"] for e in plane.accepted_events() if e["type"] == "metrics"}
    return int(exit_path.read_text()), losses, log_path.read_text()


def _adapter(store, spec) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter")
    return safetensors.torch.load(store.get_bytes(f"{prefix}/adapter_model.safetensors"))


@dataclass(frozen=True)
class Run:
    """One finished attempt that several tests compare against: its spec, store and outcome."""

    spec: JobSpec
    store: FsspecStore
    code: int
    losses: dict[int, float]
    err: str


def _staged_run(root: Path, model_dir: Path, options: dict, **changes) -> Run:
    spec, store = stage_job(root, model_dir, **options)
    spec = replace(spec, **changes)
    code, losses, err = _run(spec, root.with_suffix(".json"))
    return Run(spec, store, code, losses, err)


# Two runs with identical specs appear in two tests each: each is trained once per module (a two-rank
# run costs two trainer processes), and every test asserts on it what it asserted before.
@pytest.fixture(scope="module")
def lora_two_ranks(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Run:
    """LoRA without dropout on two ranks, the strategy left to the trainer (DDP for LoRA)."""
    return _staged_run(tmp_path_factory.mktemp("lora-two-ranks") / "run", tiny_model_dir,
                       {"lora": {"dropout": 0.0}, **OPTIONS}, gpus=2)


@pytest.fixture(scope="module")
def full_fsdp_two_ranks(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Run:
    """A full fine-tune sharded over two ranks with FSDP, uninterrupted."""
    return _staged_run(tmp_path_factory.mktemp("full-fsdp-two-ranks") / "run", tiny_model_dir, FULL,
                       training_type="full", gpus=2, distributed_strategy="fsdp")


def test_two_ranks_train_the_same_steps_as_one_process(
        tmp_path: Path, tiny_model_dir: Path, lora_two_ranks: Run) -> None:
    one, store1 = stage_job(tmp_path / "one", tiny_model_dir, lora={"dropout": 0.0}, **OPTIONS)
    code, single, err = _run(replace(one, gpus=1), tmp_path / "one.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    two, store2 = lora_two_ranks.spec, lora_two_ranks.store
    code, double, err = lora_two_ranks.code, lora_two_ranks.losses, lora_two_ranks.err
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert "rank 0 of 2 joined (gloo, ddp)" in err and "rank 1 of 2 joined (gloo, ddp)" in err
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


def _model(store, spec) -> dict[str, torch.Tensor]:
    prefix = layout.artifact_prefix(spec.tenant_id, spec.job_id, "model")
    weights = {}
    for key in store.list(prefix):
        if key.endswith(".safetensors"):
            weights.update(safetensors.torch.load(store.get_bytes(key)))
    return weights


def _close(a: dict[str, float], b: dict[str, float], rel: float = 2e-4) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= rel * abs(b[k]) for k in b)


FULL = {**OPTIONS, "hyperparameters": {**OPTIONS["hyperparameters"], "learning_rate": 1e-3}}


def test_fsdp_full_fine_tune_trains_the_same_steps_as_one_process(
        tmp_path: Path, tiny_model_dir: Path, full_fsdp_two_ranks: Run) -> None:
    one, store1 = stage_job(tmp_path / "one", tiny_model_dir, **FULL)
    one = replace(one, training_type="full", gpus=1, fused_loss="off")  # logits and loss the plain way
    code, single, err = _run(one, tmp_path / "one.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert "token losses: off" in err
    two, store2 = full_fsdp_two_ranks.spec, full_fsdp_two_ranks.store
    code, double, err = full_fsdp_two_ranks.code, full_fsdp_two_ranks.losses, full_fsdp_two_ranks.err
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert "rank 1 of 2 joined (gloo, fsdp)" in err and "sharded 2 layers" in err
    assert "token losses: chunked" in err  # the output layer's weight read while gathered
    # each rank read only its shard of the base's weights, never the whole (train/sharded_load.py)
    read = {int(m[0]): int(m[1]) for m in re.findall(r"rank (\d) read (\d+) bytes of the base model", err)}
    whole = sum(path.stat().st_size for path in tiny_model_dir.glob("*.safetensors"))
    assert set(read) == {0, 1} and all(0.4 * whole < n < 0.6 * whole for n in read.values()), (read, whole)
    assert _close(double, single) and len(single) == 4
    a, b = _model(store1, one), _model(store2, two)
    assert a.keys() == b.keys() and len(a) > 5
    assert all(torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4) for k in a)
    # each rank wrote its own shards of every checkpoint
    names = {key.rsplit("/", 1)[-1] for key in store2.list(layout.checkpoint_prefix(two.tenant_id, two.job_id, 4))}
    assert {"state-__0_0.distcp", "state-__1_0.distcp", "state-.metadata"} <= names and "model.safetensors" not in names


def test_fsdp_in_a_group_of_one_trains_the_steps_of_the_unsharded_process(
        tmp_path: Path, tiny_model_dir: Path, full_fsdp_two_ranks: Run) -> None:
    """The GPU check's "FSDP2 on one GPU" (benchmarks/gpu_cases.py): asked for explicitly, a lone
    process joins a group of one and shards; its steps are those of two ranks and of no sharding."""
    alone, store = stage_job(tmp_path / "alone", tiny_model_dir, **FULL)
    alone = replace(alone, training_type="full", gpus=1, distributed_strategy="fsdp")
    code, losses, err = _run(alone, tmp_path / "alone.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert "rank 0 of 1 joined (gloo, fsdp)" in err and "sharded 2 layers" in err
    assert _close(losses, full_fsdp_two_ranks.losses) and len(losses) == 4
    names = {key.rsplit("/", 1)[-1] for key in store.list(layout.checkpoint_prefix(alone.tenant_id, alone.job_id, 4))}
    assert {"state-__0_0.distcp", "state-.metadata"} <= names


def test_lora_sharded_with_fsdp_matches_ddp(tmp_path: Path, tiny_model_dir: Path, lora_two_ranks: Run) -> None:
    runs = {}
    for strategy in ("ddp", "fsdp"):
        if strategy == "ddp":  # LoRA's own strategy on two ranks: the module's run
            spec, store = lora_two_ranks.spec, lora_two_ranks.store
            code, losses, err = lora_two_ranks.code, lora_two_ranks.losses, lora_two_ranks.err
        else:
            spec, store = stage_job(tmp_path / strategy, tiny_model_dir, lora={"dropout": 0.0}, **OPTIONS)
            spec = replace(spec, gpus=2, distributed_strategy=strategy)
            code, losses, err = _run(spec, tmp_path / f"{strategy}.json")
        assert code == TrainerExit.SUCCESS, err[-3000:]
        runs[strategy] = (losses, _adapter(store, spec))
    (ddp_losses, ddp_adapter), (fsdp_losses, fsdp_adapter) = runs["ddp"], runs["fsdp"]
    assert _close(fsdp_losses, ddp_losses, rel=1e-4)
    assert ddp_adapter.keys() == fsdp_adapter.keys()
    assert all(torch.allclose(ddp_adapter[k], fsdp_adapter[k], atol=1e-5, rtol=1e-4) for k in ddp_adapter)


def test_a_sharded_attempt_resumes_exactly_and_on_another_number_of_processes(
        tmp_path: Path, tiny_model_dir: Path, full_fsdp_two_ranks: Run) -> None:
    """Two ranks stop after step 2, one process takes over and stops after step 3 (its
    checkpoint written alone), two ranks finish: the steps match an uninterrupted two-rank
    run. And two ranks resuming two ranks' checkpoint match it bit for bit."""
    whole, store = full_fsdp_two_ranks.spec, full_fsdp_two_ranks.store
    code, reference, err = full_fsdp_two_ranks.code, full_fsdp_two_ranks.losses, full_fsdp_two_ranks.err
    assert code == TrainerExit.SUCCESS, err[-3000:]

    first, store2 = stage_job(tmp_path / "resharded", tiny_model_dir, extra={"stop_after_step": 2}, **FULL)
    first = replace(first, training_type="full", gpus=2, distributed_strategy="fsdp")
    code, part1, err = _run(first, tmp_path / "first.json")
    assert code == TrainerExit.PREEMPTED and max(part1) == 2, err[-3000:]
    second = next_attempt(first, gpus=1, extra={"stop_after_step": 3})
    code, part2, err = _run(second, tmp_path / "second.json")
    assert code == TrainerExit.PREEMPTED, err[-3000:]
    assert "resumed from the checkpoint at step 2" in err or min(part2) == 3
    assert "RNG states seeded afresh" in err and sorted(part2) == [3]
    names = {key.rsplit("/", 1)[-1] for key in store2.list(layout.checkpoint_prefix(first.tenant_id, first.job_id, 3))}
    assert "state-__0_0.distcp" in names and "state-__1_0.distcp" not in names  # written by one process
    third = next_attempt(second, gpus=2)
    code, part3, err = _run(third, tmp_path / "third.json")
    assert code == TrainerExit.SUCCESS and sorted(part3) == [4], err[-3000:]
    assert _close({**part1, **part2, **part3}, reference)
    a, b = _model(store, whole), _model(store2, first)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4) for k in a)

    same, store3 = stage_job(tmp_path / "same", tiny_model_dir, extra={"stop_after_step": 2}, **FULL)
    same = replace(same, training_type="full", gpus=2, distributed_strategy="fsdp")
    code, before, err = _run(same, tmp_path / "same1.json")
    assert code == TrainerExit.PREEMPTED, err[-3000:]
    code, after, err = _run(next_attempt(same), tmp_path / "same2.json")
    assert code == TrainerExit.SUCCESS, err[-3000:]
    assert {**before, **after} == reference  # bit for bit
    c = _model(store3, same)
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_dpo_with_validation_on_two_sharded_ranks_equals_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The reference pass and the validations are forward passes without gradients on a
    sharded model: every rank runs them together, and training goes on from the shards."""
    from tests.unit.train.test_methods import preference_pairs

    options = {"training": preference_pairs(12, seed=3), "validation": preference_pairs(4, seed=4),
               "hyperparameters": {"n_epochs": 2, "batch_size": 6, "micro_batch_size": 2, "beta": 0.5,
                                   "learning_rate": 5e-3},
               "checkpoint": {"every_steps": 2, "keep_last": 5}, "lora": {"dropout": 0.0}}
    runs = {}
    for gpus in (1, 2):
        spec, store = stage_job(tmp_path / str(gpus), tiny_model_dir, **options)
        spec = replace(spec, method="dpo", gpus=gpus, distributed_strategy="fsdp" if gpus == 2 else "")
        code, losses, err = _run(spec, tmp_path / f"{gpus}.json")
        assert code == TrainerExit.SUCCESS, err[-3000:]
        runs[gpus] = (losses, _adapter(store, spec))
    assert _close(runs[2][0], runs[1][0], rel=1e-4) and len(runs[1][0]) == 4
    one, two = runs[1][1], runs[2][1]
    assert one.keys() == two.keys() and all(torch.allclose(one[k], two[k], atol=1e-5, rtol=1e-4) for k in one)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_reinforcement_on_two_ranks_equals_one_process(tmp_path: Path, tiny_model_dir: Path, strategy: str) -> None:
    """Every rank samples and grades the whole step from the same seeded generator (under FSDP the
    sampling's forward passes run on every rank together), then trains on its share of the rollouts."""
    from tests.unit.train.test_reinforcement import NEAR_THE, WORDS, prompt_lines
    from tuneforge import methods

    method = methods.get("reinforcement")
    resolved = method.resolve_options(method.parse_hyperparameters(
        {"grader": NEAR_THE, "samples_per_prompt": 4, "max_completion_tokens": 8, "eval_interval": 2})).model_dump()
    options = {"training": prompt_lines(WORDS), "validation": prompt_lines(WORDS[:2]),
               "hyperparameters": {"n_epochs": 1, "batch_size": 4, "micro_batch_size": 1, "learning_rate": 5e-3,
                                   "method_options": resolved},
               "checkpoint": {"every_steps": 2, "keep_last": 5}, "lora": {"dropout": 0.0}}
    runs = {}
    for gpus in (1, 2):
        spec, store = stage_job(tmp_path / str(gpus), tiny_model_dir, **options)
        spec = replace(spec, method="reinforcement", gpus=gpus, distributed_strategy=strategy if gpus == 2 else "")
        code, losses, err = _run(spec, tmp_path / f"{gpus}.json")
        assert code == TrainerExit.SUCCESS, err[-3000:]
        runs[gpus] = (losses, _adapter(store, spec))
    # a GRPO loss is ~0 by construction (advantages are centred per group): compare it absolutely
    assert runs[2][0].keys() == runs[1][0].keys() == {1, 2}
    assert all(abs(runs[2][0][step] - runs[1][0][step]) < 1e-6 for step in (1, 2))
    one, two = runs[1][1], runs[2][1]
    assert one.keys() == two.keys() and all(torch.allclose(one[k], two[k], atol=1e-5, rtol=1e-4) for k in one)
    assert any(not torch.equal(one[k], torch.zeros_like(one[k])) for k in one if "lora_B" in k)  # it trained
