from __future__ import annotations

from tests.helpers.tiny import jsonl_bytes
from tuneforge.demo.dataset import demo_examples
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.storage import layout
from tuneforge.storage.store import open_store
from tuneforge.train import batches


class CountingTokenizer:
    """Wraps a tokenizer and counts chat-template renders (tokenization work)."""

    def __init__(self, inner):
        self.inner, self.renders = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.inner.apply_chat_template(*args, **kwargs)


def test_prepared_datasets_are_tokenized_once_and_reused_exactly(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    store = open_store(str(tmp_path / "objects"))
    key = layout.dataset_key("tenant-a", "ds-abc", "train.jsonl")
    store.put_bytes(key, jsonl_bytes(demo_examples(n_keys=12)))
    tokenizer = CountingTokenizer(AutoTokenizer.from_pretrained(tiny_model_dir))
    hp = Hyperparameters(max_seq_length=64)
    first = batches.load_tokenized(store, DataFileRef("file-1", key), tokenizer, hp, label="training",
                                   base_model_sha256="f" * 64)
    renders = tokenizer.renders
    assert renders > 0 and len(first) == 12
    cached = sorted(k.rpartition("/")[2] for k in store.list("tenants/tenant-a/datasets/ds-abc") if "/tokenized/" in k)
    assert cached == ["index.json", "shard-00000.bin"]
    second = batches.load_tokenized(store, DataFileRef("file-1", key), tokenizer, hp, label="training",
                                    base_model_sha256="f" * 64)
    assert tokenizer.renders == renders  # nothing tokenized again
    assert list(second) == list(first)
    other = batches.load_tokenized(store, DataFileRef("file-1", key), tokenizer, Hyperparameters(max_seq_length=32),
                                   label="training", base_model_sha256="f" * 64)
    assert tokenizer.renders > renders and max(len(e.input_ids) for e in other) <= 32


def test_uploaded_files_are_not_cached(tmp_path):
    assert layout.tokenized_key(layout.file_key("t", "file-1", "train.jsonl"), "x") is None
