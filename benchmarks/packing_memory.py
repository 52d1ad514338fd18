"""Peak memory and time of one training step on a packed row: the 4-D block-diagonal mask
against the variable-length attention (`train/attention.py`), on this machine's CPU.

Each measurement runs in a process of its own (python this_file --child PATH LENGTH): a
random-weight Llama is built, one row of LENGTH tokens holding EXAMPLES examples goes through
forward, loss and backward as the trainer's `score_tokens` sends it, and the process reports
its peak RSS above the RSS just before the step (`ru_maxrss`; glibc's mmap threshold pinned,
as in tests/unit/train/test_memory_estimate.py, so that freed tensors leave RSS) and the step's
wall time. The two paths see the same weights, tokens and position ids; the script also checks
that their losses agree.

    python benchmarks/packing_memory.py                  # 8k and 16k tokens a row
    python benchmarks/packing_memory.py --lengths 4096,8192,16384 --examples 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import torch_machine_line  # noqa: E402 - benchmarks/ is not a package

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 256, 2, 4, 2, 512, 2048
PATHS = ("mask", "varlen")


def child(path: str, length: int, examples: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tuneforge.data.tokenize import TokenizedExample
    from tuneforge.train import attention
    from tuneforge.train.batches import collate_packed, score_tokens

    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    config = LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, intermediate_size=INTERMEDIATE, vocab_size=VOCAB,
                         max_position_embeddings=length)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    chosen = attention.choose(model) if path == "varlen" else attention.implementation(model)
    model.train()
    size = length // examples
    generator = torch.Generator().manual_seed(1)
    row = []
    for _ in range(examples):
        ids = torch.randint(0, VOCAB, (size,), generator=generator).tolist()
        row.append(TokenizedExample(ids, ids))
    batch = collate_packed([row], 0, torch.device("cpu"), block_mask=chosen not in attention.NO_MASK)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    scores = score_tokens(model, batch)
    (scores.loss_sum / scores.count).backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"path": path, "attention": chosen, "length": length, "examples": examples,
            "peak_mib": round((peak - before) / 1024, 1), "seconds": round(seconds, 3),
            "loss": float(scores.loss_sum / scores.count)}


def measure(path: str, length: int, examples: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, __file__, "--child", path, str(length), str(examples)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{path} at {length}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,16384", help="Comma list of tokens per packed row.")
    parser.add_argument("--examples", type=int, default=4, help="Examples per row (equal lengths).")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    print(torch_machine_line())
    print(f"model: Llama, hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads ({KV_HEADS} kv), vocabulary {VOCAB}; "
          f"one row, {args.examples} examples of equal length; fp32, forward + loss + backward\n")
    print("| tokens a row | path | attention | peak MiB above start | step s | loss |")
    print("|---:|---|---|---:|---:|---:|")
    for length in (int(part) for part in args.lengths.split(",")):
        results = {path: measure(path, length, args.examples) for path in PATHS}
        for path in PATHS:
            r = results[path]
            print(f"| {length} | {path} | {r['attention']} | {r['peak_mib']} | {r['seconds']} | {r['loss']:.5f} |")
        mask, varlen = results["mask"], results["varlen"]
        agree = abs(mask["loss"] - varlen["loss"]) <= 1e-4 * abs(mask["loss"])
        print(f"|  | varlen / mask | | {varlen['peak_mib'] / mask['peak_mib']:.2f}x | "
              f"{varlen['seconds'] / mask['seconds']:.2f}x | {'equal' if agree else 'DIFFER'} |")


if __name__ == "__main__":
    main()
