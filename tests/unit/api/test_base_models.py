from __future__ import annotations

from tests.helpers.platform import fake_model_dir
from tuneforge.services.serving.base_models import model_sha256


def test_model_sha_is_stable_and_tracks_weights_config_and_tokenizer(tmp_path):
    model = fake_model_dir(tmp_path / "m")
    first = model_sha256(model)
    assert first == model_sha256(model)
    (model / "README.md").write_text("docs do not change the pin")
    assert model_sha256(model) == first
    (model / "model.safetensors").write_bytes(b"\1" * 64)
    changed = model_sha256(model)
    assert changed != first
    (model / "tokenizer.json").write_text('{"v": 2}')
    assert model_sha256(model) not in (first, changed)
