"""Peak host memory per rank of an FSDP2 attempt, with the base loaded into shards (each rank reads
only its rows: `train/sharded_load.py`) against the previous way (every rank loads the whole base,
then shards it: `TUNEFORGE_SHARDED_LOAD=0`), in the same run, at 1, 2 and 4 ranks on the CPU (gloo).

A random-weight Llama of about `--params-b` billion parameters (float32 on the CPU) is written once
as safetensors into the trainer's base-model cache; each layout then runs the real trainer
(`python -m tuneforge.train SPEC`, which starts the other ranks itself) for `--steps` LoRA steps.
A thread reads every process of the attempt's peak resident set (VmHWM) until they exit. Printed
per layout: each rank's peak RSS, the largest, its ratio to the single process's, the losses, and
whether they equal the other way's at the same world size.

    python benchmarks/sharded_loading.py                   # ~0.55B, 1/2/4 ranks
    python benchmarks/sharded_loading.py --params-b 0.1    # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ReportSink, process_tree, torch_machine_line  # noqa: E402 - benchmarks/ is not a package


def _vm_hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def build(folder: Path, params_b: float) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tuneforge.demo.tiny_model import CHAT_TEMPLATE, build_tokenizer

    tokenizer = build_tokenizer(1024)
    tokenizer.chat_template = CHAT_TEMPLATE
    hidden = 1536
    per_layer = 4 * hidden * hidden + 3 * hidden * 4096
    vocab = 32000
    layers = max(1, round((params_b * 1e9 - 2 * vocab * hidden) / per_layer))
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4096, num_hidden_layers=layers,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
        model.model.rotary_emb.__init__(config)  # its buffers, made on the meta device above
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, max_shard_size="1GB")
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def run(root: Path, sha: str, ranks: int, sharded: bool, args: argparse.Namespace, sink: ReportSink) -> dict[str, Any]:
    from tuneforge.domain.spec import (
        BaseModelRef,
        CheckpointPolicy,
        DataFileRef,
        Hyperparameters,
        JobSpec,
        LoraConfig,
    )
    from tuneforge.storage import layout, open_store

    name = f"{ranks}-{'sharded' if sharded else 'whole'}"
    work = root / name
    store = open_store(str(work / "objects"))
    key = layout.file_key("bench", "file-train", "train.jsonl")
    rows = [json.dumps({"messages": [{"role": "user", "content": f"question {i} " * 8},
                                     {"role": "assistant", "content": f"answer {i} " * 8}]})
            for i in range(args.steps * 2 * ranks)]  # `steps` optimizer steps of 2 rows a rank
    store.put_bytes(key, ("\n".join(rows) + "\n").encode())
    micro = 2  # rows a rank per step
    spec = JobSpec(
        job_id=f"ftjob-{name}", tenant_id="bench", attempt=1, seed=0,
        base_model=BaseModelRef("rand", sha, layout.base_model_prefix("rand", sha)),
        training_file=DataFileRef("file-train", key), validation_file=None, method="supervised",
        training_type="lora", lora=LoraConfig(rank=8, alpha=16),
        hyperparameters=Hyperparameters(n_epochs=1, batch_size=micro * ranks, micro_batch_size=micro,
                                        max_seq_length=64, packing=False),
        checkpoint=CheckpointPolicy(every_steps=100_000, keep_last=1, every_epoch=False),
        storage_url=str(work / "objects"), callback_url=sink.url, job_token="bench", gpus=ranks,
        cache_dir=str(root / "cache"), distributed_strategy="fsdp" if ranks > 1 else "",
    )
    spec.write(work / "spec.json")
    env = {**os.environ, "TUNEFORGE_SHARDED_LOAD": "1" if sharded else "0", "OMP_NUM_THREADS": "1"}
    sink.events.clear()
    process = subprocess.Popen([sys.executable, "-m", "tuneforge.train", str(work / "spec.json")], env=env,
                               stdout=subprocess.DEVNULL, stderr=open(work / "trainer.log", "w"))  # noqa: SIM115
    peaks: dict[int, int] = {}
    started = time.monotonic()
    while process.poll() is None:
        for pid in process_tree(process.pid):
            peaks[pid] = max(peaks.get(pid, 0), _vm_hwm_kib(pid))
        if time.monotonic() - started > args.timeout:
            process.kill()
        time.sleep(0.05)
    losses = [e["data"]["train_loss"] for e in sink.events if e.get("type") == "metrics"][:args.steps]
    per_rank = sorted((kib / 1024 for pid, kib in peaks.items() if kib > 0), reverse=True)[:ranks]
    return {"layout": name, "exit_code": process.returncode, "ranks": ranks,
            "peak_rss_mib_per_rank": [round(v) for v in per_rank], "largest_mib": round(max(per_rank or [0])),
            "losses": losses, "wall_s": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params-b", type=float, default=0.55)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    from tuneforge.storage import layout

    print(torch_machine_line())
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tuneforge-sharded-") as tmp, ReportSink() as sink:
        root = Path(tmp)
        folder = layout.cached_base_model_dir(root / "cache", "randbase")
        count = build(folder, args.params_b)
        (folder / layout.COMPLETE_NAME).write_text("randbase")
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        print(json.dumps({"parameters": count, "safetensors_mib": round(size / 2**20)}), flush=True)
        for ranks in args.ranks:
            for sharded in ((False,) if ranks == 1 else (False, True)):
                results.append(run(root, "randbase", ranks, sharded, args, sink))
                print(json.dumps(results[-1]), flush=True)
    single = next((r["largest_mib"] for r in results if r["ranks"] == 1), None)
    for ranks in sorted({r["ranks"] for r in results if r["ranks"] > 1}):
        whole = next(r for r in results if r["layout"] == f"{ranks}-whole")
        sharded = next(r for r in results if r["layout"] == f"{ranks}-sharded")
        print(json.dumps({
            "ranks": ranks, "whole_largest_mib": whole["largest_mib"], "sharded_largest_mib": sharded["largest_mib"],
            "sharded_vs_single": round(sharded["largest_mib"] / single, 2) if single else None,
            "whole_vs_single": round(whole["largest_mib"] / single, 2) if single else None,
            "losses_equal": whole["losses"] == sharded["losses"] and bool(whole["losses"])}))


if __name__ == "__main__":
    main()
