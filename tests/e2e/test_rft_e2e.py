"""A reinforcement fine-tuning job through a running server, a real trainer process and the official
`openai` SDK, graded by a python grader in the sandbox: the held-out reward rises clearly above the
base model's, a gate on it passes, every step's figures are in the events, and the adapter loads
with PEFT.

The task (chosen to be learnable on a CPU in seconds by the tiny random model): each prompt's
completion is rewarded by how close it comes, character by character, to the line's `target`
("the the the the the the"): `difflib.SequenceMatcher.ratio`, a dense reward in [0, 1] that the
random base scores ~0.25 on. The grader is a python grader, so the sandbox runs in the trainer."""

from __future__ import annotations

import io
import json

import pytest

from tests.e2e.test_lifecycle import download, wait_for
from tests.helpers.files import processed
from tuneforge.graders import sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only,
              pytest.mark.skipif(sandbox.available() is not None, reason="this host cannot run the sandbox")]

TARGET = "the the the the the the"
SOURCE = '''
import difflib

def grade(sample, item):
    return difflib.SequenceMatcher(None, sample["output_text"], item["target"]).ratio()
'''
WORDS = ["cats", "dogs", "code", "rain", "tea", "maps", "trees", "birds", "lamps", "boats", "clouds", "songs",
         "hats", "roads", "waves", "fires"]


def _file(sdk, words: list[str], name: str) -> str:
    lines = [{"messages": [{"role": "user", "content": f"Say something about {word}"}], "target": TARGET}
             for word in words]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = processed(sdk, sdk.files.create(file=(name, io.BytesIO(data)), purpose="fine-tune").id)
    assert uploaded.status == "processed", uploaded.status_details
    return uploaded.id


def test_an_rft_job_raises_the_held_out_reward(running, tmp_path):
    import torch
    from peft import PeftModel

    from tuneforge.train.model import load_base_model

    sdk = running.sdk(running.key_a)
    training, held_out = _file(sdk, WORDS[:12], "train.jsonl"), _file(sdk, WORDS[12:], "held.jsonl")
    grader = {"type": "python", "name": "closeness", "source": SOURCE}
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training, validation_file=held_out, seed=0,
        method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {
            "n_epochs": 8, "batch_size": 4, "learning_rate": 5e-3, "samples_per_prompt": 8,
            "max_completion_tokens": 16, "eval_interval": 4}}},
        extra_body={"eval": {"golden": False, "safety": False, "gates": [
            {"metric": "validation.reward", "op": ">=", "threshold": 0.1, "relative_to_base": True}]}},
    )
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    assert done.method.reinforcement.grader.name == "closeness"
    metrics = [e.data for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
    steps = {m["step"]: m for m in metrics}
    assert sorted(steps) == list(range(1, 25))
    assert all({"reward_mean", "reward_std", "grader_error_rate", "completion_length"} <= set(m)
               for m in steps.values())
    assert all(m["grader_error_rate"] == 0.0 for m in steps.values())
    results = done.model_extra["eval_results"]
    base, tuned = results["base"]["validation.reward"], results["fine_tuned"]["validation.reward"]
    assert tuned > base + 0.1, (base, tuned)
    assert results["gates"]["passed"] is True
    folder = download(running.url, running.key_a, job.id, tmp_path)
    model = PeftModel.from_pretrained(load_base_model(running.model_dir, torch.device("cpu"))[0], str(folder))
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0


def test_an_rft_jobs_judges_are_asked_through_the_control_plane_and_metered_to_the_job(
        tmp_path, database_url, tiny_model_dir):
    """The trainer holds no judge's URL or key: it sends its conversations to the control plane, which
    asks the tenant's own endpoint (with the tenant's secret) and the base model it serves."""
    import httpx

    from tests.e2e.conftest import start_plane
    from tests.helpers.fake_judge import FakeJudge

    judge = FakeJudge([{"role": "assistant", "content": '{"result": 0.7}'}])
    plane = start_plane(tmp_path, database_url, tiny_model_dir, egress_allow="127.0.0.1", min_training_examples=4)
    try:
        sdk = plane.sdk(plane.key_a)
        sdk.post("/secrets", body={"name": "judge-key", "value": "tenant-key-123"}, cast_to=object)
        prompt = [{"role": "user", "content": "Grade {{sample.output_text}} for {{item.target}}"}]
        grader = {"type": "multi", "name": "both", "calculate_output": "mine + house / 100", "graders": {
            "mine": {"type": "score_model", "name": "mine", "model": "my-judge", "endpoint": judge.url,
                     "api_key_secret": "judge-key", "input": prompt},
            "house": {"type": "score_model", "name": "house", "model": "tiny-chat", "input": prompt,
                      "sampling_params": {"max_completions_tokens": 6}}}}
        job = sdk.fine_tuning.jobs.create(
            model="tiny-chat", training_file=_file(sdk, WORDS[:4], "train.jsonl"), seed=0,
            method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {
                "n_epochs": 1, "batch_size": 4, "samples_per_prompt": 2, "max_completion_tokens": 4,
                "max_grader_error_rate": 1.0}}})
        done = wait_for(sdk, job.id)
        assert done.status == "succeeded", done.error
        (step,) = [e.data for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
        assert step["reward_mine"] == pytest.approx(0.7)
        # the tiny model's JSON is no score: each of its judgements is a parse error, counted
        assert step["reward_house"] == 0.0 and step["grader_error_rate"] == 1.0
        assert len(judge.requests) == 8 and {r["auth"] for r in judge.requests} == {"Bearer tenant-key-123"}
        assert {r["body"]["messages"][0]["content"].rsplit(" for ", 1)[1] for r in judge.requests} == {TARGET}
        usage = httpx.get(f"{plane.url}/v1/usage", headers={"Authorization": f"Bearer {plane.key_a}"}).json()
        rows = {row["kind"]: row for row in usage["tokens"]}
        assert set(rows) == {"judge.tenant", "judge.served"}
        assert all(row["job_id"] == job.id and row["requests"] == 8 for row in rows.values())
        assert (rows["judge.tenant"]["prompt_tokens"], rows["judge.tenant"]["completion_tokens"]) == (240, 56)
        assert rows["judge.served"]["model"] == "tiny-chat" and 0 < rows["judge.served"]["completion_tokens"] <= 48
        other = httpx.get(f"{plane.url}/v1/usage", headers={"Authorization": f"Bearer {plane.key_b}"}).json()
        assert other["tokens"] == []
    finally:
        plane.close()
        judge.close()
