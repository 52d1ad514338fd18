"""A step's history row as the metrics event and the checkpoint's metrics, with an objective's own figures."""

from __future__ import annotations

import pytest

from tuneforge.domain.metrics import OBJECTIVE_METRICS_KEY, check_metric_names, checkpoint_metrics, metrics_data

ROW = {"step": 3, "train_loss": 1.5, "train_accuracy": 0.25, "valid_loss": None, "valid_mean_token_accuracy": None,
       "learning_rate": 1e-4, "grad_norm": 0.5, "tokens_per_second": 100.0}


def test_a_row_without_figures_of_its_own_gives_what_it_always_gave() -> None:
    assert metrics_data(ROW, 10) == {"step": 3, "total_steps": 10, "train_loss": 1.5,
                                     "train_mean_token_accuracy": 0.25, "learning_rate": 1e-4, "grad_norm": 0.5,
                                     "tokens_per_second": 100.0}
    assert list(checkpoint_metrics(ROW)) == ["train_loss", "train_mean_token_accuracy", "valid_loss",
                                             "valid_mean_token_accuracy", "full_valid_loss",
                                             "full_valid_mean_token_accuracy"]


def test_an_objectives_figures_follow_the_loops_own_by_name_in_their_order() -> None:
    row = {**ROW, OBJECTIVE_METRICS_KEY: {"reward_mean": 0.75, "rollout_mean_length": 4.5}}
    data = metrics_data(row, 10)
    assert list(data)[-2:] == ["reward_mean", "rollout_mean_length"]
    assert (data["reward_mean"], data["rollout_mean_length"], data["train_loss"]) == (0.75, 4.5, 1.5)
    metrics = checkpoint_metrics(row)
    assert list(metrics)[-2:] == ["reward_mean", "rollout_mean_length"]
    assert metrics["rollout_mean_length"] == 4.5
    assert OBJECTIVE_METRICS_KEY not in data and OBJECTIVE_METRICS_KEY not in metrics


def test_a_figure_never_takes_the_place_of_the_loops_own() -> None:
    row = {**ROW, OBJECTIVE_METRICS_KEY: {"train_loss": 99.0, "valid_loss": 99.0}}  # (refused when reported)
    assert metrics_data(row, 10)["train_loss"] == 1.5
    assert checkpoint_metrics(row)["valid_loss"] is None


@pytest.mark.parametrize("name", ["train_loss", "grad_norm", "total_steps", "full_valid_loss", "objective_metrics"])
def test_the_loops_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"must not be called '{name}'"):
        check_metric_names(["reward_mean", name])


@pytest.mark.parametrize("name", ["Reward", "reward mean", "", "1st", "a" * 65, "reward-mean"])
def test_a_name_that_is_no_plain_identifier_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must match"):
        check_metric_names([name])


def test_plain_names_pass() -> None:
    check_metric_names(["reward_mean", "rollout_mean_length", "kl2", "a" * 64])
