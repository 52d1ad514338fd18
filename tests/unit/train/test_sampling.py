"""The rollout sampler's draw: each token as often as its probability says, reproducibly."""

from __future__ import annotations

import torch

from tuneforge.train.sampling import draw


def test_each_token_is_drawn_as_often_as_its_probability_and_never_an_impossible_one() -> None:
    probabilities = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = torch.log(probabilities).expand(40_000, -1)  # log 0 = -inf: a token that cannot be drawn
    drawn = draw(logits, 1.0, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(drawn, minlength=5).double() / len(drawn)
    # 40,000 draws: each frequency within 4 standard errors of its probability
    assert torch.all((frequencies - probabilities.double()).abs() <= 4 * (0.25 / 40_000) ** 0.5), frequencies
    assert frequencies[4] == 0.0
    again = draw(logits, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(drawn, again)  # the same generator state draws the same tokens


def test_temperature_sharpens_and_flattens_the_draw() -> None:
    logits = torch.tensor([2.0, 0.0]).expand(20_000, -1)
    cold = draw(logits, 0.25, torch.Generator().manual_seed(1)).eq(0).double().mean()
    hot = draw(logits, 4.0, torch.Generator().manual_seed(1)).eq(0).double().mean()
    expected = {t: float(torch.softmax(torch.tensor([2.0, 0.0]) / t, dim=0)[0]) for t in (0.25, 4.0)}
    assert abs(cold - expected[0.25]) < 0.01 and abs(hot - expected[4.0]) < 0.02
