"""Capacity pools on the local executor: two logical nodes, one a "spot" pool, one "on-demand".
A job with a deadline starts on spot; its trainers there are reclaimed twice (once by the
operator's reclaim notice, once by a SIGTERM straight to the trainer, as a spot VM's shutdown
sends); past its allowance of preemptions it resumes on on-demand and finishes with an
adapter bit-equal to the same job run uninterrupted on on-demand. Each attempt is billed at its
own pool's price, and the job shows its saving against on-demand."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.conftest import start_plane
from tests.e2e.test_lifecycle import download, wait_for
from tuneforge.db.tables import Attempt
from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files

pytestmark = [pytest.mark.e2e, pytest.mark.local_executor, pytest.mark.sqlite_pass_only]

ADMIN = "adm-pools"
SPOT_PRICE, ON_DEMAND_PRICE = 1.0, 4.0
POOLS = {"spot": {"kind": "spot", "price_per_gpu_hour": SPOT_PRICE, "preemptions_per_hour": 0.1,
                  "nodes": ["local-1"]},
         "on-demand": {"kind": "on_demand", "price_per_gpu_hour": ON_DEMAND_PRICE, "nodes": ["local"]}}


def _attempts(world, job_id: str) -> list[Attempt]:
    with world.plane.platform.db.session() as session:
        return list(session.query(Attempt).filter_by(job_id=job_id).order_by(Attempt.number))


def _wait_running_with_steps(world, sdk, job_id: str, number: int, timeout_s: float = 120) -> Attempt:
    """Attempt `number` of the job is running and has reported a step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        attempts = _attempts(world, job_id)
        if len(attempts) >= number and attempts[number - 1].status == "running" and attempts[number - 1].step > 0 \
                and (attempts[number - 1].handle or {}).get("pid"):
            return attempts[number - 1]
        time.sleep(0.2)
    raise AssertionError(f"attempt {number} of {job_id} did not get going: {sdk.fine_tuning.jobs.retrieve(job_id)}")


def _wait_requeued(world, job_id: str, number: int, timeout_s: float = 90) -> Attempt:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        attempt = _attempts(world, job_id)[number - 1]
        if attempt.status == "preempted":
            return attempt
        time.sleep(0.2)
    raise AssertionError(f"attempt {number} of {job_id} was not preempted: "
                         f"{[(a.status, a.exit_code, a.step, a.handle) for a in _attempts(world, job_id)]}")


def test_a_spot_job_falls_back_to_on_demand_and_ends_bit_equal(tmp_path, database_url, tiny_model_dir):
    # a short job expects far less than one reclaim at 0.1 per node-hour: one preemption beyond that is allowed,
    # the second sends it to on-demand
    world = start_plane(tmp_path, database_url, tiny_model_dir, local_nodes=2, local_gpus=1, capacity_pools=POOLS,
                        spot_max_preemptions=1, admin_api_key=ADMIN)
    try:
        sdk = world.sdk(world.key_a)
        files = write_demo_files(tmp_path / "data")
        training = sdk.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
        hyperparameters = {**DEMO_HYPERPARAMETERS, "n_epochs": 24}  # 72 steps: room for two reclaims

        def create(resources: dict):  # noqa: ANN202
            return sdk.fine_tuning.jobs.create(
                model="tiny-chat", training_file=training.id, seed=7, suffix="pools",
                method={"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
                extra_body={"training_type": {"type": "lora", **DEMO_LORA}, "checkpointing": {"every_steps": 1000},
                            "resources": resources})

        steady = create({"capacity": "on_demand"})
        spot = create({"capacity": "auto", "deadline": int(time.time()) + 86_400})

        first = _wait_running_with_steps(world, sdk, spot.id, 1)
        assert first.placement["pool"] == "spot" and first.placement["node"] == "local-1"
        reclaimed = httpx.post(f"{world.url}/v1/admin/pools/spot/reclaim", headers={"Authorization": f"Bearer {ADMIN}"})
        assert reclaimed.status_code == 200, reclaimed.text
        assert reclaimed.json()["attempts"] == [{"job_id": spot.id, "attempt": 1}]
        _wait_requeued(world, spot.id, 1)

        second = _wait_running_with_steps(world, sdk, spot.id, 2)
        assert second.placement["pool"] == "spot"  # one preemption: still within its allowance
        os.killpg(int(second.handle["pid"]), signal.SIGTERM)  # the VM's shutdown notice, straight to the trainer
        _wait_requeued(world, spot.id, 2)

        done = wait_for(sdk, spot.id, timeout_s=300)
        assert done.status == "succeeded", done.error
        reference = wait_for(sdk, steady.id, timeout_s=300)
        assert reference.status == "succeeded", reference.error

        attempts = _attempts(world, spot.id)
        assert [(a.status, a.placement["pool"]) for a in attempts] == [
            ("preempted", "spot"), ("preempted", "spot"), ("succeeded", "on-demand")]
        assert [a.placement["pool"] for a in _attempts(world, steady.id)] == ["on-demand"]
        messages = [e.message for e in sdk.fine_tuning.jobs.list_events(spot.id, limit=100)]
        assert any(m.startswith("Fine-tuning job started (attempt 3) on on-demand capacity") for m in messages)

        # the same weights as the run that was never interrupted
        for folder in ("spot", "steady"):
            (tmp_path / folder).mkdir()
        ours = load_file(download(world.url, world.key_a, spot.id, tmp_path / "spot") / "adapter_model.safetensors")
        theirs = load_file(download(world.url, world.key_a, steady.id, tmp_path / "steady")
                           / "adapter_model.safetensors")
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

        # billed per pool: the spot attempts at the spot price, the last at on-demand's
        listed = httpx.get(f"{world.url}/v1/fine_tuning/jobs/{spot.id}/attempts",
                           headers={"Authorization": f"Bearer {world.key_a}"}).json()
        assert [(a["pool"], a["price_per_gpu_hour"]) for a in listed["data"]] == [
            ("spot", SPOT_PRICE), ("spot", SPOT_PRICE), ("on-demand", ON_DEMAND_PRICE)]
        seconds = [a.ended_at - a.started_at for a in attempts]
        expected = sum(s / 3600 * p for s, p in zip(seconds, (SPOT_PRICE, SPOT_PRICE, ON_DEMAND_PRICE)))
        assert listed["cost"]["so_far"] == pytest.approx(expected, abs=1e-3)
        assert listed["cost"]["on_demand"] == pytest.approx(sum(seconds) / 3600 * ON_DEMAND_PRICE, abs=1e-3)
        assert listed["cost"]["saving"] > 0
        usage = httpx.get(f"{world.url}/v1/usage", headers={"Authorization": f"Bearer {world.key_a}"}).json()
        row = next(r for r in usage["data"] if r["job_id"] == spot.id)
        assert row["cost"] == pytest.approx(listed["cost"]["so_far"], abs=1e-3)
        assert row["saving"] == pytest.approx(listed["cost"]["saving"], abs=1e-3)
    finally:
        world.close()
