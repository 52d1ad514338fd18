"""The demo's promises: a loadable deterministic tiny model, and a task the trainer learns."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.tiny import stage_job
from tuneforge.demo.dataset import (
    DEMO_HYPERPARAMETERS,
    DEMO_LORA,
    demo_examples,
    demo_facts,
    write_demo_files,
)
from tuneforge.demo.evaluate import answer, load_finetuned, mapping_accuracy
from tuneforge.demo.tiny_model import build_tiny_model, count_parameters
from tuneforge.domain.exit_codes import TrainerExit
from tuneforge.storage import layout
from tuneforge.train.reporter import RecordingReporter
from tuneforge.train.runner import run_attempt


def test_tiny_model_loads_with_auto_classes(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "llama"
    assert 100_000 < count_parameters(model) < 2_000_000
    assert len(tokenizer) == model.config.vocab_size == 1024
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|begin_of_text|>", "<|im_end|>", "<|pad|>"
    )
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|begin_of_text|><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                      "<|im_start|>assistant\n")
    code = "def load_data(x):"
    assert tokenizer.decode(tokenizer(code)["input_ids"], skip_special_tokens=True) == code


def test_tiny_model_is_deterministic_per_seed(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_demo_files_are_deterministic_chat_jsonl(tmp_path: Path) -> None:
    files = write_demo_files(tmp_path)
    assert files.training_path.read_bytes() == write_demo_files(tmp_path / "again").training_path.read_bytes()
    assert len(files.training_path.read_text().splitlines()) == 24
    assert len(files.validation_path.read_text().splitlines()) == 6
    facts = demo_facts()
    assert len({f.key for f in facts}) == len({f.code for f in facts}) == 24
    roles = [m["role"] for m in files.examples[0]["messages"]]
    assert roles == ["system", "user", "assistant"]


def test_demo_settings_teach_the_mapping(tmp_path: Path, tiny_model_dir: Path) -> None:
    examples = demo_examples()
    hp = {**DEMO_HYPERPARAMETERS, "micro_batch_size": DEMO_HYPERPARAMETERS["batch_size"]}
    spec, store = stage_job(
        tmp_path, tiny_model_dir, training=examples, hyperparameters=hp, lora=DEMO_LORA,
    )
    assert run_attempt(spec, store, RecordingReporter()) == TrainerExit.SUCCESS
    adapter_dir = tmp_path / "adapter"
    store.download_prefix(layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter"), adapter_dir)

    base, tokenizer = load_finetuned(tiny_model_dir)
    tuned, _ = load_finetuned(tiny_model_dir, adapter_dir)
    assert mapping_accuracy(base, tokenizer, examples) == 0.0
    assert mapping_accuracy(tuned, tokenizer, examples) >= 0.9
    fact = demo_facts()[0]
    assert answer(tuned, tokenizer, f"What is the code for {fact.key}?") == fact.code
