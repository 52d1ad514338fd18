"""The trainer on one GPU, case by case, with nothing downloaded: random-weight models shaped like
0.5B, 1.5B and 7B decoders (Qwen2.5's sizes, their vocabularies included), each trained for a few
steps by the real trainer process (`python -m tuneforge.train SPEC`, as an executor starts it):
LoRA, QLoRA (where bitsandbytes is installed), a full fine-tune, and FSDP2 on the one GPU; packed
rows (variable-length attention: the trainer names the path it took, flash or SDPA) and the fused
token loss on. Printed per case, and written as JSON (`--json-out`): steps, the median of real
tokens/s over the steps after the first two, MFU, the trainer's peak GPU memory, what NVML said
(utilisation, power, temperature), the attention path and the token-loss mode, the first and last
loss, and the wall time. Cases run in order until `--budget-s` is spent; the rest are reported
as skipped.

    python benchmarks/gpu_cases.py --json-out /tmp/gpu-cases.json     # on a CUDA host
    python benchmarks/gpu_cases.py --cpu                               # the script itself, tiny, on CPU

The model is written once per shape straight into the trainer's base-model cache (no object-store
copy), with the demo's byte-level BPE tokenizer (its ids are a corner of the large vocabulary).
Reports go to a sink on 127.0.0.1 that keeps the metrics events.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ReportSink  # noqa: E402 - benchmarks/ is not a package

# Qwen2.5's shapes: hidden, intermediate, layers, heads, kv heads, vocabulary, tied embeddings
SHAPES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "0.5B": (896, 4864, 24, 14, 2, 151936, True),
    "1.5B": (1536, 8960, 28, 12, 2, 151936, True),
    "7B": (3584, 18944, 28, 28, 4, 152064, False),
    "tiny": (64, 192, 2, 4, 2, 4096, False),  # --cpu
}
# (shape, training type, distributed strategy, micro-batch)
GPU_CASES = [
    ("0.5B", "lora", "", 8), ("0.5B", "qlora", "", 8), ("0.5B", "full", "", 8), ("0.5B", "full", "fsdp", 8),
    ("1.5B", "lora", "", 4), ("1.5B", "full", "", 4), ("7B", "lora", "", 2), ("7B", "qlora", "", 2),
]
CPU_CASES = [("tiny", "lora", "", 2), ("tiny", "full", "", 2), ("tiny", "full", "fsdp", 2)]
_WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi") for b in ("n", "r", "s", "l", "")]


def build_model(shape: str, folder: Path, device: str) -> int:
    """A random-weight Qwen2 decoder of `shape` and the demo tokenizer, saved in bf16 (fp32 on the
    CPU) into `folder`; returns its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tuneforge.demo.tiny_model import CHAT_TEMPLATE, build_tokenizer

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    tokenizer = build_tokenizer(1024)
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                         tie_word_embeddings=tied, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    count = sum(p.numel() for p in model.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, max_shard_size="5GB")
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return count


def write_data(path: Path, rows: int, words: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as out:
        for _ in range(rows):
            question = " ".join(rng.choice(_WORDS) for _ in range(words // 4))
            answer = " ".join(rng.choice(_WORDS) for _ in range(words))
            out.write(json.dumps({"messages": [{"role": "user", "content": question},
                                               {"role": "assistant", "content": answer}]}) + "\n")


def run_case(case: tuple[str, str, str, int], root: Path, sha: str, data: Path, args: argparse.Namespace,
             sink: ReportSink, timeout_s: float) -> dict[str, Any]:
    from tuneforge.domain.spec import (
        BaseModelRef,
        CheckpointPolicy,
        DataFileRef,
        Hyperparameters,
        JobSpec,
        LoraConfig,
    )
    from tuneforge.storage import layout, open_store

    shape, training_type, strategy, micro = case
    name = f"{shape}-{training_type}" + (f"-{strategy}" if strategy else "")
    work = root / name
    store = open_store(str(work / "objects"))
    key = layout.file_key("bench", "file-train", "train.jsonl")
    store.put_file(key, data)
    rate = 1e-5 if training_type == "full" else 1e-4
    hp = Hyperparameters(n_epochs=1, batch_size=micro, micro_batch_size=micro, learning_rate=rate,
                         max_seq_length=args.seq, packing=True, warmup_ratio=0.0)
    spec = JobSpec(
        job_id=f"ftjob-{name.lower().replace('.', '')}", tenant_id="bench", attempt=1, seed=0,
        base_model=BaseModelRef(f"rand-{shape}", sha, layout.base_model_prefix(f"rand-{shape}", sha)),
        training_file=DataFileRef("file-train", key), validation_file=None, method="supervised",
        training_type=training_type, lora=LoraConfig(rank=16, alpha=32), hyperparameters=hp,
        checkpoint=CheckpointPolicy(every_steps=100_000, keep_last=1, every_epoch=False),
        storage_url=str(work / "objects"), callback_url=sink.url, job_token="bench",
        gpus=0 if args.cpu else 1, cache_dir=str(root / "cache"), distributed_strategy=strategy,
        gradient_checkpointing=shape == "7B",
    )
    spec.write(work / "spec.json")
    sink.events.clear()
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "tuneforge.train", str(work / "spec.json")], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        code, log = done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, log = -1, (exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or "")
    wall = time.perf_counter() - started
    metrics = [e["data"] for e in sink.events if e.get("type") == "metrics"]
    steady = metrics[2:] or metrics

    def median(key: str) -> float | None:
        values = [m[key] for m in steady if isinstance(m.get(key), (int, float))]
        return round(statistics.median(values), 4) if values else None

    def line(marker: str) -> str:
        found = [row.split(marker, 1)[1].strip() for row in log.splitlines() if marker in row]
        return found[-1] if found else ""

    shutil_rmtree(work / "objects")
    return {
        "case": name, "exit_code": code, "steps": len(metrics), "wall_s": round(wall, 1),
        "tokens_per_second": median("tokens_per_second"), "mfu": median("mfu"),
        "peak_memory_mb": max((m.get("peak_memory_mb") or 0 for m in metrics), default=None),
        "gpu_utilization": median("gpu_utilization"), "gpu_power_w": median("gpu_power_w"),
        "gpu_temperature_c": max((m["gpu_temperature_c"] for m in metrics if m.get("gpu_temperature_c")), default=None),
        "first_loss": metrics[0].get("train_loss") if metrics else None,
        "last_loss": metrics[-1].get("train_loss") if metrics else None,
        "attention": line("packed rows attend with"), "token_losses": line("token losses:"),
        "error": "" if code == 0 else log[-1500:],
    }


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="Tiny shapes on the CPU: checks the script itself.")
    parser.add_argument("--cases", nargs="*", help="Case names to run (e.g. 0.5B-lora 7B-qlora); default: all.")
    parser.add_argument("--steps", type=int, default=12, help="About this many optimizer steps a case.")
    parser.add_argument("--seq", type=int, default=2048, help="Packed row length (max_seq_length).")
    parser.add_argument("--budget-s", type=float, default=420.0, help="Stop starting cases after this long.")
    parser.add_argument("--json-out", default="", help="Also write the results here, as JSON.")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    cases = CPU_CASES if args.cpu else GPU_CASES
    if args.cases:
        cases = [c for c in cases if f"{c[0]}-{c[1]}" + (f"-{c[2]}" if c[2] else "") in args.cases]
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("gpu_cases: no CUDA GPU on this machine: skipped")
            return
        print(f"gpu_cases: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    try:
        import bitsandbytes  # noqa: F401

        has_bnb = True
    except Exception:  # noqa: BLE001 - absent, or without a usable CUDA build
        has_bnb = False
    from tuneforge.storage import layout

    began = time.monotonic()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tuneforge-gpu-cases-") as tmp, ReportSink() as sink:
        root = Path(tmp)
        built: dict[str, tuple[Path, str, int]] = {}
        data = root / "train.jsonl"
        for case in cases:
            name = f"{case[0]}-{case[1]}" + (f"-{case[2]}" if case[2] else "")
            left = args.budget_s - (time.monotonic() - began)
            if left < 30:
                results.append({"case": name, "skipped": "the time budget is spent"})
                print(json.dumps(results[-1]), flush=True)
                continue
            if case[1] == "qlora" and (args.cpu or not has_bnb):
                results.append({"case": name, "skipped": "bitsandbytes is not installed" if not args.cpu else "CPU"})
                print(json.dumps(results[-1]), flush=True)
                continue
            if case[0] not in built:
                sha = f"rand{case[0].lower().replace('.', '')}"
                folder = layout.cached_base_model_dir(root / "cache", sha)
                started = time.perf_counter()
                count = build_model(case[0], folder, device)
                (folder / layout.COMPLETE_NAME).write_text(sha)  # the trainer's cache: no store copy
                built[case[0]] = (folder, sha, count)
                print(json.dumps({"model": case[0], "parameters": count,
                                  "build_s": round(time.perf_counter() - started, 1)}), flush=True)
            folder, sha, count = built[case[0]]
            # rows of ~seq/3 tokens: about three a packed row, `steps` micro-batches in all
            write_data(data, rows=max(8, args.steps * case[3] * 3), words=max(8, args.seq // 6))
            result = run_case(case, root, sha, data, args, sink, timeout_s=max(30.0, left))
            result["parameters"] = count
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"device": device, "cases": results}, indent=2))
    failed = [r["case"] for r in results if r.get("exit_code") not in (None, 0)]
    print(f"gpu_cases: {len(results)} cases, failed: {', '.join(failed) or 'none'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
