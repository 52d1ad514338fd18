"""Which keys an attempt may reach through the object proxy (storage/access.py)."""

from __future__ import annotations

import contextlib

import pytest

from tuneforge.storage import layout
from tuneforge.storage.access import KeyRefused, clean_key, job_scope

TRAIN = "tenants/t1/datasets/ds-abc/train.jsonl"
VALID = "tenants/t1/datasets/ds-abc/valid.jsonl"
TASK = "tenants/t1/files/file-task/tasks.jsonl"
BASE = "base-models/tiny/0123"
PARENT = "tenants/t1/jobs/ftjob-parent/artifacts/model"


@pytest.fixture
def scope():
    return job_scope("t1", "ftjob-1", data_keys=[TRAIN, VALID, TASK, ""], model_prefixes=[BASE, PARENT, ""])


def test_its_own_job_folder_is_read_and_written(scope):
    for key in (layout.checkpoint_file_key(layout.checkpoint_prefix("t1", "ftjob-1", 5), "adapter.safetensors"),
                layout.results_key("t1", "ftjob-1"), f"{layout.artifact_prefix('t1', 'ftjob-1', 'adapter')}/x",
                f"{layout.parent_adapter_prefix('t1', 'ftjob-1')}/adapter_config.json"):
        assert scope.may_read(key) and scope.may_write(key)
    assert scope.may_list(layout.checkpoints_prefix("t1", "ftjob-1"))
    # a job whose id begins with this one's is another job
    assert not scope.may_read("tenants/t1/jobs/ftjob-10/results.csv")
    assert not scope.may_read(layout.job_prefix("t1", "ftjob-1"))  # the folder itself is no object


def test_data_files_are_read_only_and_exactly_those(scope):
    for key in (TRAIN, VALID, TASK):
        assert scope.may_read(key) and not scope.may_write(key)
    assert not scope.may_read("tenants/t1/datasets/ds-abc/manifest.json")
    assert not scope.may_read("tenants/t1/files/file-other/other.jsonl")
    assert not scope.may_list("tenants/t1/files")


def test_caches_beside_its_data_are_read_and_written(scope):
    tokenized = layout.tokenized_key(TRAIN, "base-sha-2048")
    reference = layout.reference_logps_key(TRAIN, "ident")
    for key in (tokenized, reference, layout.reference_logps_key(TASK, "x")):
        assert key and scope.may_read(key) and scope.may_write(key)
    # an uploaded file's folder has no tokenized cache; a cache of another dataset is not this job's
    assert not scope.may_write("tenants/t1/files/file-task/tokenized/tasks.jsonl-x.npz")
    assert not scope.may_read("tenants/t1/datasets/ds-other/tokenized/train.jsonl-x.npz")
    assert not scope.may_write(TRAIN + ".reference-logps-")  # the beginning alone is no key


def test_starting_weights_are_read_only(scope):
    for key in (f"{BASE}/config.json", f"{PARENT}/model.safetensors"):
        assert scope.may_read(key) and not scope.may_write(key)
    assert scope.may_list(BASE) and scope.may_list(f"{BASE}/sub")
    assert not scope.may_read("base-models/tiny/0123456/config.json")
    assert not scope.may_read("base-models/other/1/config.json")


def test_nothing_else_and_no_way_around_by_spelling(scope):
    for key in ("tenants/t2/files/file-x/data.jsonl", "tenants/t2/jobs/ftjob-1/results.csv",
                "eval-sets/suite/a.jsonl", "secrets.key", "tuneforge.db"):
        assert not scope.may_read(key) and not scope.may_write(key)
    for prefix in ("", "/", "tenants", "tenants/t1", "tenants/t1/jobs", "base-models"):
        with pytest.raises(KeyRefused) if prefix.strip("/") == "" else contextlib.nullcontext():
            assert not scope.may_list(prefix)
    for bad in ("tenants/t1/jobs/ftjob-1/../../t2/files/x", "tenants/t1/jobs/ftjob-1/./x",
                "tenants/t1/jobs/ftjob-1//x", "tenants\\t1"):
        with pytest.raises(KeyRefused):
            scope.may_read(bad)
    assert clean_key("/tenants/t1/jobs/ftjob-1/x/") == "tenants/t1/jobs/ftjob-1/x"

