"""The demo fine-tune, measured end to end in the real trainer process.

For each seed: build the tiny model (`tuneforge.demo.tiny_model`), write the
demo mapping (`tuneforge.demo.dataset`), put both in a local object store, run
`python -m tuneforge.train SPEC.json` with DEMO_HYPERPARAMETERS and DEMO_LORA
(reports go to a throwaway HTTP sink on 127.0.0.1), then score the base model
and base + adapter with `tuneforge.demo.evaluate.mapping_accuracy`.

Prints the model size, the trainer's wall time (process start to exit,
imports included) and both accuracies.

    python benchmarks/demo_sft.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files
from tuneforge.demo.evaluate import load_finetuned, mapping_accuracy
from tuneforge.demo.tiny_model import build_tiny_model, count_parameters
from tuneforge.domain.spec import (
    BaseModelRef,
    CheckpointPolicy,
    DataFileRef,
    Hyperparameters,
    JobSpec,
    LoraConfig,
)
from tuneforge.storage import layout, open_store

TRAINER_TIMEOUT_S = 600.0
MAX_MICRO_BATCH = 8  # what the control plane picks for a batch of 8


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        payload = b'{"action": "continue"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _spec(root: Path, seed: int, callback_url: str) -> tuple[JobSpec, Path, list[dict]]:
    model_dir = build_tiny_model(root / "model", seed=seed)
    files = write_demo_files(root / "data", seed=seed)
    store = open_store(str(root / "objects"))
    model_prefix = layout.base_model_prefix("tiny-demo", f"seed{seed}")
    store.upload_dir(model_dir, model_prefix)
    train_key = layout.file_key("bench", "file-train", "train.jsonl")
    valid_key = layout.file_key("bench", "file-valid", "valid.jsonl")
    store.put_file(train_key, files.training_path)
    store.put_file(valid_key, files.validation_path)
    batch_size = DEMO_HYPERPARAMETERS["batch_size"]
    hp = {**DEMO_HYPERPARAMETERS, "micro_batch_size": min(batch_size, MAX_MICRO_BATCH), "max_seq_length": 256}
    spec = JobSpec(
        job_id="ftjob-bench", tenant_id="bench", attempt=1, seed=seed,
        base_model=BaseModelRef("tiny-demo", f"seed{seed}", model_prefix),
        training_file=DataFileRef("file-train", train_key),
        validation_file=DataFileRef("file-valid", valid_key),
        method="supervised", training_type="lora",
        lora=LoraConfig(**DEMO_LORA), hyperparameters=Hyperparameters(**hp),
        checkpoint=CheckpointPolicy(every_steps=50, keep_last=2),
        storage_url=str(root / "objects"), callback_url=callback_url, job_token="bench",
        cache_dir=str(root / "cache"),
    )
    return spec, model_dir, files.examples


def measure(seed: int, callback_url: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="tuneforge-demo-bench-") as tmp:
        root = Path(tmp)
        spec, model_dir, examples = _spec(root, seed, callback_url)
        spec.write(root / "spec.json")
        started = time.perf_counter()
        process = subprocess.run(
            [sys.executable, "-m", "tuneforge.train", str(root / "spec.json")],
            capture_output=True, text=True, timeout=TRAINER_TIMEOUT_S, check=False,
        )
        wall_s = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"trainer exited {process.returncode}:\n{process.stderr[-3000:]}")
        adapter_dir = root / "adapter"
        open_store(spec.storage_url).download_prefix(
            layout.artifact_prefix(spec.tenant_id, spec.job_id, "adapter"), adapter_dir
        )
        base, tokenizer = load_finetuned(model_dir)
        tuned, _ = load_finetuned(model_dir, adapter_dir)
        return {
            "seed": seed,
            "parameters": count_parameters(base),
            "trainer_wall_s": round(wall_s, 2),
            "base_accuracy": mapping_accuracy(base, tokenizer, examples),
            "tuned_accuracy": mapping_accuracy(tuned, tokenizer, examples),
        }


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        print(json.dumps({"hyperparameters": DEMO_HYPERPARAMETERS, "lora": DEMO_LORA}))
        for seed in args.seeds:
            print(json.dumps(measure(seed, f"http://127.0.0.1:{server.server_address[1]}")), flush=True)
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
