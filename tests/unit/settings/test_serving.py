"""The serving settings' bounds on generation: documented defaults, per-tier tokens in flight
(an unlisted tier gets the free tier's), and a default max_tokens that fits the cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tuneforge.settings import Settings


def test_the_defaults_bound_every_tier_and_fit_eight_default_choices_in_the_free_tier():
    settings = Settings()
    assert settings.inference_default_max_tokens == 256
    assert settings.inference_max_tokens_per_request == 4096
    assert [settings.inference_tokens_in_flight_for(tier) for tier in ("free", "standard", "premium")] == [
        4096, 16384, 65536]
    assert settings.inference_tokens_in_flight_for("free") >= 8 * settings.inference_default_max_tokens


def test_a_tier_the_setting_leaves_out_gets_the_free_tiers_bound(monkeypatch):
    assert Settings(inference_tokens_in_flight_by_tier={}).inference_tokens_in_flight_for("standard") == 4096
    monkeypatch.setenv("TUNEFORGE_INFERENCE_TOKENS_IN_FLIGHT_BY_TIER", '{"free": 1000, "premium": 9000}')
    settings = Settings()
    assert settings.inference_tokens_in_flight_for("premium") == 9000
    assert settings.inference_tokens_in_flight_for("standard") == 1000


def test_bounds_must_be_positive_and_the_default_within_the_cap():
    with pytest.raises(ValidationError, match="inference_tokens_in_flight_by_tier"):
        Settings(inference_tokens_in_flight_by_tier={"free": 0})
    with pytest.raises(ValidationError, match="inference_default_max_tokens"):
        Settings(inference_default_max_tokens=512, inference_max_tokens_per_request=256)
