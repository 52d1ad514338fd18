"""Champion and challenger end to end, through the SDK and real trainer processes on the tiny
model: the first model of a lineage learns the platform's golden set and goes to production; a
second job of the same lineage (same base, same suffix) trains on something else, so its golden
loss stays near the base model's: it passes its gate against the base, but it is far worse than
the production model, and its promotion is refused (champion_regression). A model whose job was
not evaluated stays in dev."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.test_lifecycle import wait_for
from tuneforge.demo.dataset import DEMO_LORA, chat_example, demo_facts, write_jsonl
from tuneforge.eval import shipped

pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_pass_only]

GATE = {"metric": "golden.loss", "op": "<=", "threshold": 0.5, "relative_to_base": True}
EVAL = {"golden": True, "safety": False, "max_new_tokens": 1, "gates": [GATE]}


def _train(sdk, tmp_path, name: str, rows: list[dict], *, learning_rate: float, n_epochs: int,
           eval_body: dict | None = EVAL):
    path = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    training = sdk.files.create(file=path.open("rb"), purpose="fine-tune").id
    extra = {"training_type": {"type": "lora", **DEMO_LORA}, "checkpointing": {"every_steps": 1000}}
    if eval_body is not None:
        extra["eval"] = eval_body
    job = sdk.fine_tuning.jobs.create(
        model="tiny-chat", training_file=training, suffix="support", seed=0, extra_body=extra,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": n_epochs, "batch_size": 8, "learning_rate": learning_rate}}})
    done = wait_for(sdk, job.id)
    assert done.status == "succeeded", done.error
    return done


def _promote(sdk, model_id: str, stage: str):
    return sdk.post(f"/models/{model_id}/promote", body={"stage": stage}, cast_to=object)


def test_a_challenger_worse_than_production_is_blocked(running, tmp_path):
    sdk = running.sdk(running.key_a)
    golden = [{"messages": row["messages"]} for row in shipped.golden_examples()]
    champion = _train(sdk, tmp_path, "champion", golden, learning_rate=5e-3, n_epochs=4)
    results = champion.model_extra["eval_results"]
    assert results["fine_tuned"]["golden.loss"] < results["base"]["golden.loss"] - 1.0  # it learned the set
    for stage in ("staging", "production"):
        assert _promote(sdk, champion.fine_tuned_model, stage)["stage"] == stage

    other = [chat_example(fact) for fact in demo_facts(16, seed=5)]
    challenger = _train(sdk, tmp_path, "challenger", other, learning_rate=1e-5, n_epochs=1)
    model = sdk.models.retrieve(challenger.fine_tuned_model).model_extra
    base_gate = model["gates"][0]
    assert base_gate["metric"] == "golden.loss" and base_gate["passed"] is True and model["promotable"] is True
    verdict = model["champion"]
    assert verdict["model"] == champion.fine_tuned_model and verdict["passed"] is False
    compared = verdict["comparisons"][0]
    assert compared["compared"] is True and compared["difference"] > 0.5
    assert compared["champion"] == pytest.approx(results["fine_tuned"]["golden.loss"])
    with pytest.raises(openai.ConflictError) as info:
        _promote(sdk, challenger.fine_tuned_model, "staging")
    assert info.value.body["code"] == "champion_regression"
    assert champion.fine_tuned_model in info.value.body["message"]
    assert sdk.models.retrieve(challenger.fine_tuned_model).model_extra["stage"] == "dev"

    # a job with the eval off: its model is not evaluated and stays in dev
    unevaluated = _train(sdk, tmp_path, "quick", other, learning_rate=1e-5, n_epochs=1, eval_body=None)
    assert sdk.models.retrieve(unevaluated.fine_tuned_model).model_extra["evaluated"] is False
    with pytest.raises(openai.ConflictError) as info:
        _promote(sdk, unevaluated.fine_tuned_model, "staging")
    assert info.value.body["code"] == "model_not_evaluated"
