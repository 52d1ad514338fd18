"""JobRequest: the one place that says which method a request asks for and where its
hyperparameters are."""

from __future__ import annotations

import pydantic
import pytest

from tuneforge.domain.job_config import JobRequest, SupervisedHyperparameters, TrainingType
from tuneforge.methods.dpo import DpoHyperparameters
from tuneforge.methods.orpo import OrpoHyperparameters
from tuneforge.planning.hyperparams import requested_hyperparameters


def _request(**fields) -> JobRequest:
    return JobRequest.model_validate({"model": "tiny-base", "training_file": "file-x", **fields})


def test_without_a_method_block_a_request_is_supervised_with_auto_hyperparameters():
    request = _request()
    assert request.method_type == "supervised"
    assert requested_hyperparameters(request) == SupervisedHyperparameters()
    assert requested_hyperparameters(request).n_epochs == "auto"
    assert request.training_type_kind == "lora" and request.effective_training_type == TrainingType()


def test_the_method_block_names_the_method_and_holds_its_hyperparameters():
    dpo = _request(method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 2}}},
                   training_type={"type": "qlora"})
    assert dpo.method_type == "dpo" and dpo.training_type_kind == "qlora"
    assert isinstance(requested_hyperparameters(dpo), DpoHyperparameters)
    assert requested_hyperparameters(dpo).beta == 0.2 and requested_hyperparameters(dpo).n_epochs == 2
    # a preference method without its block still has beta (at "auto")
    orpo = _request(method={"type": "orpo"})
    assert orpo.method_type == "orpo" and requested_hyperparameters(orpo) == OrpoHyperparameters()
    cpt = _request(method={"type": "cpt"})
    assert type(requested_hyperparameters(cpt)) is SupervisedHyperparameters


def test_the_deprecated_top_level_hyperparameters_count_for_supervised_jobs_only():
    plain = _request(hyperparameters={"n_epochs": 4, "batch_size": 2})
    assert plain.method_type == "supervised"
    assert requested_hyperparameters(plain).n_epochs == 4 and requested_hyperparameters(plain).batch_size == 2
    # the method block wins over them
    both = _request(hyperparameters={"n_epochs": 4},
                    method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 7}}})
    assert requested_hyperparameters(both).n_epochs == 7
    # a preference method does not take them
    dpo = _request(hyperparameters={"n_epochs": 4}, method={"type": "dpo"})
    assert requested_hyperparameters(dpo) == DpoHyperparameters()


def test_a_request_stores_what_was_given_and_reads_back_equal():
    given = {"model": "tiny-base", "training_file": "file-x", "seed": 7,
             "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}},
             "training_type": {"type": "lora", "rank": 4}, "data": {"remove_duplicates": True}}
    request = JobRequest.from_json(given)
    assert request.to_json() == given  # only the fields given: defaults are not written
    assert JobRequest.from_json(request.to_json()) == request


def test_a_request_is_frozen():
    request = _request(method={"type": "dpo"})
    with pytest.raises(pydantic.ValidationError):
        request.seed = 3  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        request.method.type = "supervised"  # type: ignore[misc]
