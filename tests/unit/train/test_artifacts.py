"""The results file: the loop's columns, then an objective's own figures."""

from __future__ import annotations

from tuneforge.train.artifacts import results_csv


def _row(step: int, **own: float) -> dict:
    row = {"step": step, "train_loss": 2.0 / step, "train_accuracy": 0.5, "valid_loss": None,
           "valid_mean_token_accuracy": None, "learning_rate": 1e-4}
    return {**row, "objective_metrics": own} if own else row


def test_without_figures_of_its_own_the_file_has_the_five_columns() -> None:
    assert results_csv([_row(1), _row(2)]).decode() == (
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy\n1,2.0,0.5,,\n2,1.0,0.5,,\n")


def test_own_figures_are_columns_in_the_order_they_first_appeared() -> None:
    history = [_row(1, reward_mean=0.5), _row(2, rollout_mean_length=3.0, reward_mean=0.25), _row(3)]
    assert results_csv(history).decode().splitlines() == [
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy,reward_mean,rollout_mean_length",
        "1,2.0,0.5,,,0.5,",
        "2,1.0,0.5,,,0.25,3.0",
        "3,0.6666666666666666,0.5,,,,",
    ]

