"""Packing: best-fit decreasing rows, and no contamination across packed examples."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample, tokenize_example
from tuneforge.domain.spec import Hyperparameters
from tuneforge.train.batches import collate, collate_packed, pack, score_tokens, step_micro_batches
from tuneforge.train.model import load_base_model


def test_best_fit_decreasing_fills_rows_without_overflow():
    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(200)]
    rows = pack(lengths, 128)
    assert sorted(i for row in rows for i in row) == list(range(200))  # every example once
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows)
    assert len(rows) <= -(-sum(lengths) // 128) * 1.15  # close to the lower bound
    assert pack(lengths, 128) == rows  # deterministic
    # longest first; 60 fills the 70-row exactly, the second 60 opens a row, 10 goes where it fits
    assert pack([70, 60, 60, 10], 130) == [[0, 1], [2, 3]]
    # best fit: 30 goes to the row with the least room that fits it (32 free, not 35)
    assert pack([65, 68, 30], 100) == [[1, 2], [0]]
    assert pack([5, 300], 128) == [[1], [0]]  # too long for a row: a row of its own


@pytest.fixture(scope="module")
def model_and_examples(tiny_model_dir):
    model, tokenizer = load_base_model(tiny_model_dir, torch.device("cpu"))
    model.eval()
    rng = random.Random(1)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    examples = []
    for n in [3, 40, 7, 25, 1, 60, 12, 5, 33, 9]:
        messages = [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(n))},
                    {"role": "assistant", "content": " ".join(rng.choice(words) for _ in range(n // 2 + 2))}]
        examples.append(tokenize_example({"messages": messages}, tokenizer, max_seq_length=256))
    return model, tokenizer, examples


def _per_token_losses(model, batch) -> torch.Tensor:
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    if batch.position_ids is not None:
        inputs["position_ids"] = batch.position_ids
    with torch.no_grad():
        logits = model(**inputs).logits[:, :-1].float()
    targets = batch.labels[:, 1:]
    return F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("path", ["mask", "varlen"])
def test_per_example_losses_with_packing_equal_those_without(model_and_examples, tiny_model_dir, path):
    """Both ways of keeping packed examples apart: the block-diagonal mask, and the variable-length
    attention (train/attention.py), which needs no mask at all."""
    from tuneforge.train import attention

    model, tokenizer, examples = model_and_examples
    if path == "varlen":
        model, _ = load_base_model(tiny_model_dir, torch.device("cpu"))
        assert attention.choose(model) == attention.VARLEN
        model.eval()
    alone = []
    for example in examples:
        losses = _per_token_losses(model, collate([example], tokenizer.pad_token_id, torch.device("cpu")))[0]
        targets = torch.tensor(example.labels[1:]) != IGNORE_INDEX
        alone.append(losses[: len(example.labels) - 1][targets])
    rows = pack([len(e.input_ids) for e in examples], 160)
    assert any(len(row) > 1 for row in rows)  # some rows really hold several examples
    batch = collate_packed([[examples[i] for i in row] for row in rows], tokenizer.pad_token_id, torch.device("cpu"),
                           block_mask=path == "mask")
    assert (batch.attention_mask is None) == (path == "varlen")
    losses = _per_token_losses(model, batch)
    compared = 0
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            size = len(examples[i].input_ids)
            # targets of this example in the row: labels at start+1 .. start+size-1
            packed = losses[r, start: start + size - 1]
            targets = torch.tensor(examples[i].labels[1:]) != IGNORE_INDEX
            torch.testing.assert_close(packed[targets], alone[i], rtol=1e-4, atol=1e-5)
            compared += int(targets.sum())
            # the boundary: the last token of the previous example predicts nothing of this one
            if start > 0:
                assert batch.labels[r, start] == IGNORE_INDEX
            start += size
        assert (batch.labels[r, start:] == IGNORE_INDEX).all()  # the row's padding is never a target
    assert compared == sum(len(a) for a in alone)


def test_a_packed_step_scores_like_the_unpacked_one_with_less_padding(model_and_examples):
    model, tokenizer, examples = model_and_examples
    results = {}
    for packing in (False, True):
        hp = Hyperparameters(micro_batch_size=4, max_seq_length=256, packing=packing)
        loss, count, real, slots = 0.0, 0, 0, 0
        for rows in step_micro_batches(examples, hp):
            batch = (collate_packed(rows, tokenizer.pad_token_id, torch.device("cpu")) if packing
                     else collate([row[0] for row in rows], tokenizer.pad_token_id, torch.device("cpu")))
            with torch.no_grad():
                scores = score_tokens(model, batch)
            loss, count = loss + float(scores.loss_sum), count + scores.count
            real, slots = real + batch.num_tokens, slots + batch.num_slots
        results[packing] = (loss / count, count, real, slots)
    assert results[True][1] == results[False][1]  # the same target tokens
    assert results[True][2] == results[False][2] == sum(len(e.input_ids) for e in examples)
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5)
    assert results[True][3] < results[False][3]  # fewer computed positions: less padding


def _model_stub(**config):
    from types import SimpleNamespace

    return SimpleNamespace(config=SimpleNamespace(**config), dtype=torch.bfloat16)


def test_the_block_mask_follows_the_attention_implementation_and_the_layer_windows():
    from tuneforge.train.batches import packed_mask_options

    assert packed_mask_options(_model_stub(_attn_implementation="sdpa")) == {"mask_dtype": None, "window": None}
    # eager attention adds the mask to the scores: a float mask in the model's dtype
    assert packed_mask_options(_model_stub(_attn_implementation="eager", sliding_window=32)) == {
        "mask_dtype": torch.bfloat16, "window": 32}
    assert packed_mask_options(_model_stub(_attn_implementation="flash_attention_2", sliding_window=32)) == {
        "block_mask": False}
    mixed = _model_stub(_attn_implementation="sdpa", sliding_window=32,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert packed_mask_options(mixed) == {"mask_dtype": None,
                                          "window": {"sliding_attention": 32, "full_attention": None}}
    # layer types all alike: one mask (a window set in the config but used by no layer is ignored)
    assert packed_mask_options(_model_stub(_attn_implementation="sdpa", sliding_window=32,
                                           layer_types=["full_attention"] * 2))["window"] is None


def test_packing_is_refused_for_layers_a_block_mask_cannot_separate():
    from tuneforge.train.batches import packed_mask_options
    from tuneforge.train.errors import UserInputError

    hybrid = _model_stub(_attn_implementation="sdpa", layer_types=["linear_attention", "full_attention"])
    with pytest.raises(UserInputError) as refused:
        packed_mask_options(hybrid)
    assert refused.value.code == "packing_unsupported" and refused.value.param == "hyperparameters.packing"
    assert "linear_attention" in str(refused.value)


def test_sliding_window_and_additive_masks_of_a_packed_row():
    examples = [TokenizedExample([5, 6, 7, 8], [5, 6, 7, 8]), TokenizedExample([9, 10], [9, 10])]
    cpu = torch.device("cpu")
    boolean = collate_packed([examples], 0, cpu, window=2).attention_mask[0, 0]
    assert boolean.tolist() == [
        [True, False, False, False, False, False],
        [True, True, False, False, False, False],
        [False, True, True, False, False, False],  # the window: itself and one before
        [False, False, True, True, False, False],
        [False, False, False, False, True, False],  # the second example starts afresh
        [False, False, False, False, True, True],
    ]
    per_type = collate_packed([examples], 0, cpu, window={"full_attention": None, "sliding_attention": 2},
                              mask_dtype=torch.float32).attention_mask
    assert set(per_type) == {"full_attention", "sliding_attention"}
    assert torch.equal(per_type["sliding_attention"][0, 0] == 0, boolean)
    assert per_type["full_attention"][0, 0, 3, 0] == 0  # no window: the whole example
    assert per_type["sliding_attention"][0, 0, 3, 0] == torch.finfo(torch.float32).min
