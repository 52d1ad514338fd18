"""Tokenized data on disk (train/token_shards.py): exact contents, the store cache, bounded memory."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.tiny import jsonl_bytes
from tuneforge.data.tokenize import IGNORE_INDEX, TokenizedExample, tokenize_example
from tuneforge.demo.dataset import demo_examples
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.domain.spec import DataFileRef, Hyperparameters
from tuneforge.storage import layout
from tuneforge.storage.store import open_store
from tuneforge.train import batches, token_shards


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_shards_hold_exactly_the_examples_tokenizing_in_memory_gives(tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(token_shards, "SHARD_BYTES", 300)  # several shards
    records = demo_examples(n_keys=12) + [{"prompt": "ünïcödé 😀 \x01 bytes", "completion": " 12345 67"}]
    expected = [tokenize_example(r, tokenizer, max_seq_length=40, train_on_inputs=False) for r in records]
    shards = token_shards.build(iter(expected), len(tokenizer))
    folder = shards.folder
    assert len(shards) == len(expected) and shards.dtype == np.uint16
    assert len(list(folder.glob("shard-*.bin"))) > 2
    assert [shards[i] for i in range(len(shards))] == expected
    assert shards[-1] == expected[-1] and shards[2:5] == expected[2:5] and list(shards) == expected
    assert shards.units(range(len(shards))) == sum(batches.target_token_count(e) for e in expected)
    assert shards.units([3, 3, 0]) == 2 * batches.target_token_count(expected[3]) + \
        batches.target_token_count(expected[0])
    assert shards.num_tokens == sum(len(e.input_ids) for e in expected)
    with pytest.raises(IndexError):
        shards[len(expected)]
    shards.close()
    assert not folder.exists()  # the scratch folder goes with the object


def test_wide_vocabularies_keep_32_bit_ids_and_labels_must_be_their_ids() -> None:
    example = TokenizedExample([5, 70_000, 131_071, 9], [IGNORE_INDEX, 70_000, 131_071, IGNORE_INDEX])
    shards = token_shards.build([example], 131_072)
    assert shards.dtype == np.int32 and shards[0] == example
    with pytest.raises(ValueError, match="neither its token's id"):
        token_shards.build([TokenizedExample([1, 2], [1, 3])], 100)
    with pytest.raises(ValueError, match="out of the range"):
        token_shards.build([TokenizedExample([1, 70_000], [1, 70_000])], 1000)


def test_stored_shards_are_reused_and_a_damaged_one_is_tokenized_again(tmp_path, tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(token_shards, "SHARD_BYTES", 500)
    store = open_store(str(tmp_path / "objects"))
    key = layout.dataset_key("tenant-a", "ds-abc", "train.jsonl")
    store.put_bytes(key, jsonl_bytes(demo_examples(n_keys=12)))
    hp = Hyperparameters(max_seq_length=64)
    ref = DataFileRef("file-1", key)
    first = list(batches.load_tokenized(store, ref, tokenizer, hp, label="training", base_model_sha256="f" * 64))
    stored = sorted(k for k in store.list("tenants/tenant-a/datasets/ds-abc") if "/tokenized/" in k)
    names = [k.rpartition("/")[2] for k in stored]
    assert names[0] == "index.json" and len(names) > 2 and all(n.startswith("shard-") for n in names[1:])
    index = json.loads(store.get_bytes(stored[0]))
    assert index["examples"] == 12 and [s["name"] for s in index["shards"]] == names[1:]

    calls = []
    monkeypatch.setattr(batches, "tokenize_example", lambda *a, **k: calls.append(1) or tokenize_example(*a, **k))
    assert list(batches.load_tokenized(store, ref, tokenizer, hp, label="training", base_model_sha256="f" * 64)) == \
        first
    assert not calls  # read from the store: nothing tokenized
    damaged = bytearray(store.get_bytes(stored[1]))
    damaged[-1] ^= 1
    store.put_bytes(stored[1], bytes(damaged))
    again = list(batches.load_tokenized(store, ref, tokenizer, hp, label="training", base_model_sha256="f" * 64))
    assert again == first and len(calls) == 12  # the damaged set was tokenized again, not trusted


def test_a_bad_line_names_its_line_and_leaves_no_scratch(tmp_path, tokenizer) -> None:
    from tuneforge.data.errors import BadDataError

    store = open_store(str(tmp_path / "objects"))
    key = layout.dataset_key("tenant-a", "ds-bad", "train.jsonl")
    rows = demo_examples(n_keys=3) + [{"messages": [{"role": "wizard", "content": "x"}]}]
    store.put_bytes(key, jsonl_bytes(rows))
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("tuneforge-tokens-*"))
    with pytest.raises(BadDataError) as raised:
        batches.load_tokenized(store, DataFileRef("f", key), tokenizer, Hyperparameters(max_seq_length=64),
                               label="training", base_model_sha256="f" * 64)
    assert raised.value.line_number == 4 and raised.value.code == "invalid_role"
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("tuneforge-tokens-*")) == before
    assert not [k for k in store.list("tenants/tenant-a/datasets/ds-bad") if "/tokenized/" in k]


def test_a_large_prepared_file_is_tokenized_on_demand_into_the_same_examples(tmp_path, tokenizer, monkeypatch) -> None:
    store = open_store(str(tmp_path / "objects"))
    key = layout.dataset_key("tenant-a", "ds-big", "train.jsonl")
    records = demo_examples(n_keys=12)
    store.put_bytes(key, jsonl_bytes(records))
    hp = Hyperparameters(max_seq_length=48)
    ref = DataFileRef("file-1", key)
    ahead = batches.load_tokenized(store, ref, tokenizer, hp, label="training", base_model_sha256="f" * 64)
    monkeypatch.setattr(token_shards, "TOKENIZE_AHEAD_MAX_BYTES", 100)
    calls = []
    monkeypatch.setattr(batches, "tokenize_example", lambda *a, **k: calls.append(1) or tokenize_example(*a, **k))
    lazy = batches.load_tokenized(store, ref, tokenizer, hp, label="training", base_model_sha256="f" * 64)
    assert isinstance(lazy, token_shards.OnDemand) and not calls  # nothing tokenized before it is read
    assert len(lazy) == len(ahead) == 12
    assert lazy[7] == ahead[7] and len(calls) == 1  # one read, one example tokenized
    assert list(lazy) == list(ahead) and lazy[-1] == ahead[-1] and lazy[3:6] == ahead[3:6]

    store.put_bytes(key, jsonl_bytes(records[:2]) + b'{"messages": 5}\n' + jsonl_bytes(records[2:3]))
    bad = batches.load_tokenized(store, ref, tokenizer, hp, label="training", base_model_sha256="f" * 64)
    assert bad[3] == ahead[2]
    from tuneforge.data.errors import BadDataError

    with pytest.raises(BadDataError) as raised:
        bad[2]
    assert raised.value.line_number == 3 and raised.value.detail.startswith("training file: ")


def test_line_starts_with_and_without_a_last_newline(tmp_path) -> None:
    path = tmp_path / "lines"
    for data, starts in ((b"", [0]), (b"a\n", [0, 2]), (b"ab\ncd", [0, 3, 5]), (b"x\n\ny\n", [0, 2, 3, 5])):
        path.write_bytes(data)
        assert token_shards.line_starts(path, chunk_bytes=2).tolist() == starts


# A trainer under a cap on its writable memory (RLIMIT_DATA) that the training file's tokens,
# held as lists the way the trainer held them before, would exceed several times over.
_CAPPED_RUN = r"""
import json, resource, sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.helpers.tiny import stage_job
from tuneforge.domain.spec import DataFileRef
from tuneforge.storage import layout
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt

root, model, data, budget = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
job, number, stop, method = sys.argv[6], int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]
if method == "supervised":  # this file is then read and tokenized a step's examples at a time
    from tuneforge.train import token_shards
    token_shards.TOKENIZE_AHEAD_MAX_BYTES = 1 << 20
spec, store = stage_job(root, model, training=b"{}\n", job_id=job, hyperparameters={
    "n_epochs": 1, "batch_size": 8, "micro_batch_size": 4, "max_seq_length": 64, "learning_rate": 1e-3},
    checkpoint={"every_steps": 100, "every_epoch": False})
key = layout.dataset_key(spec.tenant_id, "ds-big", "train.jsonl")
if not store.exists(key):
    store.put_file(key, data)
spec = replace(spec, method=method, training_file=DataFileRef("file-train", key), attempt=number,
               extra={"stop_after_step": stop})
def vm_data_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmData:")).split()[1])
import torch, transformers  # noqa: E401, F401 - in the baseline, as every trainer has them
cap = (vm_data_kib() * 1024) + budget
resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
reporter = RecordingReporter(attempt=number)
code = int(run_attempt(spec, store, reporter))
losses = {e["data"]["step"]: e["data"]["train_loss"] for e in reporter.events("metrics")}
print(json.dumps({"code": code, "losses": losses, "cap_mib": cap >> 20}))
"""


def _documents(path: Path, size_bytes: int, method: str) -> int:
    rng = random.Random(7)
    words = [rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(1, 6) + str(rng.randint(0, 99))
             for _ in range(4000)]
    written = rows = 0

    def text(low: int, high: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))

    lines = []
    for _ in range(3000):  # distinct lines, then repeated in a shuffled order up to the size
        record = {"text": text(80, 400)} if method == "cpt" else {"messages": [
            {"role": "user", "content": text(5, 40)}, {"role": "assistant", "content": text(20, 300)}]}
        lines.append(json.dumps(record) + "\n")
    with open(path, "w") as out:
        while written < size_bytes:
            rng.shuffle(lines)
            block = "".join(lines)
            out.write(block)
            written, rows = written + len(block), rows + len(lines)
    return rows


@pytest.mark.parametrize("method", ["cpt", "supervised"])
def test_a_training_file_larger_than_the_trainers_memory_cap_trains_and_resumes_bit_identically(
    tmp_path, tiny_model_dir, method
) -> None:
    """cpt: tokenized ahead into shards (stored, then read by the later attempts); supervised: a
    prepared file past the on-demand size, tokenized a step's examples at a time."""
    data = tmp_path / "big.jsonl"
    budget = 96 << 20  # writable memory the trainer may add to what importing torch and transformers took
    _documents(data, (12 << 20) if method == "cpt" else budget + (16 << 20), method)
    if method == "cpt":  # every token is kept (windows): the tokens as Python lists of ints (ids and
        from transformers import AutoTokenizer  # labels, ~36 bytes a token each), as held before, vs the cap

        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        with open(data) as stream:
            sample = [next(stream) for _ in range(200)]
        tokens_per_byte = sum(len(tokenizer(t)["input_ids"]) for t in sample) / sum(map(len, sample))
        assert data.stat().st_size * tokens_per_byte * 2 * 36 > 3 * budget
    else:  # the file itself is larger than the cap
        assert data.stat().st_size > budget

    def attempt(job: str, number: int, stop: int) -> dict:
        done = subprocess.run([sys.executable, "-c", _CAPPED_RUN, str(Path(__file__).parents[3]),
                               str(tmp_path / "home"), str(tiny_model_dir), str(data), str(budget), job, str(number),
                               str(stop), method],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["code"] == TrainerExit.PREEMPTED, done.stderr[-3000:]  # stopped where asked, checkpointed
        return outcome["losses"]

    straight = attempt("ftjob-straight", 1, 10)  # cpt: tokenizes the file into shards in the store
    resumed = {**attempt("ftjob-resumed", 1, 4), **attempt("ftjob-resumed", 2, 10)}  # cpt: these fetch them
    assert sorted(map(int, straight)) == list(range(1, 11)) and set(resumed) == set(straight)
    assert resumed == straight  # bit-identical per-step losses across the resume, mid-epoch
    assert all(np.isfinite(v) for v in straight.values())
