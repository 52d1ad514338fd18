"""Which jobs planning puts on the shared co-training pool (`planning.on_shared_pool`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuneforge.domain.resolved import ResolvedResources
from tuneforge.domain.spec import Hyperparameters, LoraConfig
from tuneforge.services.training.planning import on_shared_pool
from tuneforge.settings import Settings


def _plan(**changes):
    plan = SimpleNamespace(method="supervised", training_type="lora",
                           hyperparameters=Hyperparameters(n_epochs=3, batch_size=8),
                           lora=LoraConfig(rank=8, alpha=16, dropout=0.0, target_modules="all-linear"),
                           resources=ResolvedResources(gpus=1),
                           prepared=SimpleNamespace(train_examples=80, train_tokens=20_000))
    for key, value in changes.items():
        setattr(plan, key, value)
    return plan


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path, pool_jobs_max_rank=16, pool_jobs_max_steps=30, pool_jobs_max_tokens=60_000)


def test_a_small_supervised_lora_job_within_every_limit_goes_on_the_pool(settings) -> None:
    assert on_shared_pool(settings, _plan(), continued=False, asked_gpus=False)  # 30 steps, 60,000 tokens


@pytest.mark.parametrize("change", [
    {"method": "dpo"}, {"training_type": "qlora"}, {"training_type": "full"},
    {"lora": LoraConfig(rank=32, alpha=64)}, {"lora": LoraConfig(rank=8, dropout=0.05)},
    {"lora": LoraConfig(rank=8, target_modules=["q_proj"])},
    {"resources": ResolvedResources(gpus=2, strategy="ddp")},
    {"hyperparameters": Hyperparameters(n_epochs=4, batch_size=8)},  # 40 steps
    {"prepared": SimpleNamespace(train_examples=80, train_tokens=20_001)},  # 60,003 tokens
])
def test_a_job_outside_the_pools_reach_or_limits_takes_gpus_of_its_own(settings, change) -> None:
    assert not on_shared_pool(settings, _plan(**change), continued=False, asked_gpus=False)


def test_a_continued_job_a_job_that_asked_for_gpus_and_a_platform_without_pool_jobs_do_not(settings) -> None:
    assert not on_shared_pool(settings, _plan(), continued=True, asked_gpus=False)
    assert not on_shared_pool(settings, _plan(), continued=False, asked_gpus=True)
    off = settings.model_copy(update={"pool_jobs_max_rank": 0})
    assert not on_shared_pool(off, _plan(), continued=False, asked_gpus=False)
