"""The chunked token loss (train/fused_loss.py) against the plain one: the same summed loss,
argmax hits and gradients, on every architecture of the matrix (Gemma's soft-capped logits,
GPT-2's tied output layer, a mixture of experts), for LoRA and full fine-tunes, with chunks
smaller than the micro-batch; and a whole training run with it equals one without it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.helpers.archs import ARCHITECTURES, build_arch_model
from tests.helpers.tiny import stage_job
from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import LoraConfig
from tuneforge.train import fused_loss
from tuneforge.train.batches import collate, score_tokens
from tuneforge.train.model import prepare_trainable
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


def _examples(vocab: int) -> list[TokenizedExample]:
    generator = torch.Generator().manual_seed(3)
    rows = []
    for length, prompt in ((40, 12), (23, 0), (31, 5)):
        ids = torch.randint(3, vocab, (length,), generator=generator).tolist()
        rows.append(TokenizedExample(ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    return rows


def _scores(model, batch, fused: str) -> tuple[float, int, int, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    scores = score_tokens(model, batch, fused=fused)
    scores.loss_sum.backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    return float(scores.loss_sum), scores.correct, scores.count, grads


@pytest.mark.parametrize("training_type", ["lora", "full"])
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_chunked_loss_equals_the_plain_loss(arch: str, training_type: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(fused_loss, "CHUNK_LOGITS", 16 * 1024)  # 16 tokens a chunk: several a micro-batch
    folder = build_arch_model(arch, tmp_path / arch)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model = prepare_trainable(model, training_type, LoraConfig(rank=4, alpha=8, dropout=0.0), seed=0)
    model.train()
    assert fused_loss.head_of(model) is not None
    batch = collate(_examples(model.config.vocab_size), 0, torch.device("cpu"))
    plain_loss, plain_hits, plain_count, plain_grads = _scores(model, batch, "off")
    loss, hits, count, grads = _scores(model, batch, "chunked")
    assert count == plain_count == (40 - 12) + (23 - 1) + (31 - 5)  # the first token is never a target
    assert hits == plain_hits
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    for name in grads:  # float sums in another order: within 1e-5 of the tensor's largest gradient
        gap = float((grads[name] - plain_grads[name]).abs().max())
        assert gap <= 1e-5 * float(plain_grads[name].abs().max()) + 1e-9, (name, gap)
    if training_type == "full":  # the output layer's own gradient comes from the chunked pass
        output = model.get_output_embeddings().weight
        assert output.grad is not None and float(output.grad.abs().sum()) > 0


def test_the_chunk_size_does_not_change_the_result(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_arch_model("llama", tmp_path / "llama"))
    batch = collate(_examples(model.config.vocab_size), 0, torch.device("cpu"))
    with fused_loss.hidden_states_instead_of_logits(model) as captured:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    hidden = captured[-1][:, :-1].reshape(-1, model.config.hidden_size).detach()
    targets = batch.labels[:, 1:].reshape(-1)
    head = fused_loss.head_of(model)
    losses = {chunk: fused_loss.chunked_token_loss(hidden, targets, head, chunk=chunk) for chunk in (1, 7, 64, 4096)}
    assert len({hits for _, hits in losses.values()}) == 1
    first = float(losses[1][0])
    assert all(float(loss) == pytest.approx(first, rel=1e-6) for loss, _ in losses.values())


def test_models_whose_logits_it_cannot_reproduce_take_the_plain_path(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_arch_model("llama", tmp_path / "llama"))
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.config.vocab_size))
    assert fused_loss.head_of(model) is None  # a biased output layer
    model = AutoModelForCausalLM.from_pretrained(build_arch_model("llama", tmp_path / "llama2"))
    model.config.output_multiplier_scale = 0.5
    assert fused_loss.head_of(model) is None  # an unknown scaling of the logits
    assert fused_loss.resolve_mode("auto", torch.device("cpu")) == "chunked"
    assert fused_loss.resolve_mode("liger", torch.device("cpu")) == "chunked"  # no CUDA here
    with pytest.raises(ValueError):
        fused_loss.resolve_mode("fast", torch.device("cpu"))


def test_a_training_run_with_the_chunked_loss_equals_one_without(tmp_path: Path, tiny_model_dir: Path) -> None:
    results = {}
    for mode in ("off", "chunked"):
        spec, store = stage_job(tmp_path / mode, tiny_model_dir, hyperparameters={"micro_batch_size": 2})
        reporter = RecordingReporter()
        assert run_attempt(replace(spec, fused_loss=mode), store, reporter) == TrainerExit.SUCCESS
        results[mode] = [(e["data"]["train_loss"], e["data"]["train_mean_token_accuracy"])
                         for e in reporter.events("metrics")]
    assert len(results["off"]) == len(results["chunked"]) > 2
    for (loss, accuracy), (plain_loss, plain_accuracy) in zip(results["chunked"], results["off"]):
        assert loss == pytest.approx(plain_loss, rel=1e-4) and accuracy == plain_accuracy
