"""Every object key comes from tuneforge.storage.layout: exact shapes, unsafe input refused."""

from __future__ import annotations

import pytest

from tuneforge.storage import layout


def test_tenant_file_dataset_and_job_keys() -> None:
    assert layout.tenant_prefix("t1") == "tenants/t1"
    assert layout.file_key("t1", "file-abc", "train.jsonl") == "tenants/t1/files/file-abc/train.jsonl"
    assert layout.file_prefix("t1", "file-abc") == "tenants/t1/files/file-abc"
    assert layout.dataset_prefix("t1", "ds-1") == "tenants/t1/datasets/ds-1"
    assert layout.job_prefix("t1", "ftjob-9") == "tenants/t1/jobs/ftjob-9"
    assert layout.results_key("t1", "ftjob-9") == "tenants/t1/jobs/ftjob-9/results.csv"


def test_checkpoint_and_artifact_keys() -> None:
    assert layout.checkpoints_prefix("t1", "j") == "tenants/t1/jobs/j/checkpoints"
    assert layout.checkpoint_prefix("t1", "j", 120) == "tenants/t1/jobs/j/checkpoints/step-120"
    assert layout.artifact_prefix("t1", "j", "adapter") == "tenants/t1/jobs/j/artifacts/adapter"
    assert layout.artifact_prefix("t1", "j", "merged") == "tenants/t1/jobs/j/artifacts/merged"
    assert layout.MANIFEST_NAME == "manifest.json"


def test_base_model_prefix_flattens_hub_style_names() -> None:
    sha = "a" * 64
    assert layout.base_model_prefix("Qwen/Qwen2.5-0.5B", sha) == f"base-models/Qwen_Qwen2.5-0.5B/{sha}"


def test_unknown_artifact_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="artifact kind"):
        layout.artifact_prefix("t1", "j", "../adapter")


@pytest.mark.parametrize("segment", ["", ".", "..", "...", "...."])
def test_segments_that_would_be_empty_or_dot_dot_are_refused(segment: str) -> None:
    with pytest.raises(ValueError, match="object key"):
        layout.file_key("t1", "file-1", segment)
    with pytest.raises(ValueError, match="object key"):
        layout.job_prefix(segment, "job-1")


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("../../etc/passwd", "_.._etc_passwd"),
        ("a/b.jsonl", "a_b.jsonl"),
        ("my data (v2).jsonl", "my_data_v2_.jsonl"),
        (".hidden.jsonl", "hidden.jsonl"),
        ("..\\..\\win.ini", "_.._win.ini"),
    ],
)
def test_unsafe_filenames_stay_inside_their_folder(filename: str, expected: str) -> None:
    key = layout.file_key("t1", "file-1", filename)
    assert key == f"tenants/t1/files/file-1/{expected}"
    assert key.count("/") == 4
    assert ".." not in key.split("/")


@pytest.mark.parametrize(("value", "expected"), [("/", "_"), (" ", "_"), ("a/b", "a_b"), ("t\u00e9", "t_")])
def test_separators_and_other_characters_become_underscores(value: str, expected: str) -> None:
    assert layout.tenant_prefix(value) == f"tenants/{expected}"


def test_ids_cannot_escape_the_tenant_prefix() -> None:
    key = layout.job_prefix("../other-tenant", "job-1")
    assert key.startswith("tenants/")
    assert ".." not in key.split("/")
    assert key.count("/") == 3


@pytest.mark.parametrize(
    ("prefix", "step"),
    [
        ("tenants/t1/jobs/j/checkpoints/step-0", 0),
        ("tenants/t1/jobs/j/checkpoints/step-120", 120),
        ("tenants/t1/jobs/j/checkpoints/step-120/", 120),
        ("step-7", 7),
        ("tenants/t1/jobs/j/checkpoints/step-x", None),
        ("tenants/t1/jobs/j/checkpoints/step-", None),
        ("tenants/t1/jobs/j/checkpoints/step-12/manifest.json", None),
        ("tenants/t1/jobs/j/checkpoints/laststep-12", None),
        ("tenants/t1/jobs/j/checkpoints", None),
    ],
)
def test_checkpoint_step_parsing(prefix: str, step: int | None) -> None:
    assert layout.checkpoint_step(prefix) == step


def test_checkpoint_step_round_trips_checkpoint_prefix() -> None:
    for step in (0, 1, 50, 10_000):
        assert layout.checkpoint_step(layout.checkpoint_prefix("t1", "j", step)) == step


def test_files_inside_checkpoint_base_model_and_merged_folders() -> None:
    checkpoint = layout.checkpoint_prefix("t1", "j", 6)
    assert layout.trainer_state_key(checkpoint) == "tenants/t1/jobs/j/checkpoints/step-6/trainer_state.json"
    base = layout.base_model_prefix("llama", "ab12")
    assert layout.base_model_config_key(base) == "base-models/llama/ab12/config.json"
    merged = layout.merged_prefix("t1", "j", "bf16")
    assert layout.complete_marker_key(merged) == "tenants/t1/jobs/j/artifacts/merged/bf16/.complete"


def test_local_cache_folders(tmp_path, monkeypatch) -> None:
    cache = layout.local_cache_dir(tmp_path)
    assert cache == tmp_path / "cache"
    assert layout.base_model_cache_dir(cache) == tmp_path / "cache" / "base-models"
    assert layout.home_base_model_cache_dir(tmp_path) == layout.base_model_cache_dir(cache)
    assert layout.cached_base_model_dir(layout.base_model_cache_dir(cache), "ab12") == cache / "base-models" / "ab12"
    assert layout.hub_cache_dir(cache) == tmp_path / "cache" / "hub"
    served = layout.artifact_cache_dir(cache, "tenants/t1/jobs/j/artifacts/adapter")
    assert served.parent == cache / "artifacts" and len(served.name) == 32
    assert served == layout.artifact_cache_dir(cache, "tenants/t1/jobs/j/artifacts/adapter")  # the prefix names it
    assert served != layout.artifact_cache_dir(cache, "tenants/t1/jobs/k/artifacts/adapter")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert layout.default_base_model_cache_dir() == tmp_path / "xdg" / "tuneforge" / "base-models"
