"""Peak memory and time of one training step with the token loss computed the plain way
(logits of every position, then cross-entropy) against the chunked path of
`train/fused_loss.py` (the output layer and the loss a chunk of tokens at a time), on this
machine's CPU, for vocabularies of real models.

Each measurement runs in a process of its own (python this_file --child PATH VOCAB): a
random-weight Llama with a LoRA adapter on all linear layers (the trainer's
`prepare_trainable`) takes one micro-batch of ROWS x LENGTH tokens through the trainer's
`score_tokens`, then backward; the process reports its peak RSS above the RSS just before
the step (`ru_maxrss`; glibc's mmap threshold pinned so that freed tensors leave RSS), the
step's wall time (best of REPEATS), the loss and the gradient of one LoRA weight, which the
script compares between the two paths.

    python benchmarks/fused_loss.py                       # vocabularies 32k, 128k, 152k
    python benchmarks/fused_loss.py --vocabs 32000 --length 4096 --full
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

PATHS = ("off", "chunked")


def child(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tuneforge.data.tokenize import TokenizedExample
    from tuneforge.domain.spec import LoraConfig
    from tuneforge.train.batches import collate, score_tokens
    from tuneforge.train.model import prepare_trainable

    path, vocab = args.child[0], int(args.child[1])
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 11 // 4,
                         vocab_size=vocab, max_position_embeddings=args.length)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = prepare_trainable(model, "full" if args.full else "lora", LoraConfig(rank=16, alpha=32, dropout=0.0),
                              seed=0)
    model.train()
    generator = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(args.rows):
        ids = torch.randint(0, vocab, (args.length,), generator=generator).tolist()
        rows.append(TokenizedExample(ids, ids))
    batch = collate(rows, 0, torch.device("cpu"))
    probe = next(param for name, param in model.named_parameters() if param.requires_grad and "lora_B" in name) \
        if not args.full else model.get_output_embeddings().weight
    best, before, loss = float("inf"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 0.0
    for _ in range(args.repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        scores = score_tokens(model, batch, fused=path)
        (scores.loss_sum / scores.count).backward()
        best = min(best, time.perf_counter() - started)
        loss = float(scores.loss_sum / scores.count)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"path": path, "vocab": vocab, "peak_mib": round((peak - before) / 1024, 1), "seconds": round(best, 3),
            "loss": loss, "grad": probe.grad.double().flatten()[:4096].tolist()}


def measure(args: argparse.Namespace, path: str, vocab: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    command = [sys.executable, __file__, "--child", path, str(vocab), f"--hidden={args.hidden}",
               f"--layers={args.layers}", f"--length={args.length}", f"--rows={args.rows}",
               f"--repeats={args.repeats}"] + (["--full"] if args.full else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{path} at vocabulary {vocab}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocabs", default="32000,128256,151936", help="Comma list of vocabulary sizes.")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048, help="Tokens a row.")
    parser.add_argument("--rows", type=int, default=1, help="Rows a micro-batch.")
    parser.add_argument("--repeats", type=int, default=2, help="Steps measured; the best time is kept.")
    parser.add_argument("--full", action="store_true", help="Full fine-tune (the output layer trains too).")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    print(torch_machine_line())
    print(f"model: Llama, hidden {args.hidden}, {args.layers} layers, "
          f"{'full fine-tune' if args.full else 'LoRA r16 all-linear'}; "
          f"micro-batch {args.rows} x {args.length} tokens; fp32; forward + loss + backward\n")
    print("| vocabulary | loss path | peak MiB above start | step s | loss |")
    print("|---:|---|---:|---:|---:|")
    for vocab in (int(part) for part in args.vocabs.split(",")):
        results = {path: measure(args, path, vocab) for path in PATHS}
        for path in PATHS:
            r = results[path]
            print(f"| {vocab} | {'plain' if path == 'off' else path} | {r['peak_mib']} | {r['seconds']} "
                  f"| {r['loss']:.5f} |")
        plain, chunked = results["off"], results["chunked"]
        scale = max(abs(x) for x in plain["grad"]) or 1.0
        grad_gap = max(abs(a - b) for a, b in zip(plain["grad"], chunked["grad"])) / scale
        agree = abs(plain["loss"] - chunked["loss"]) <= 1e-4 * abs(plain["loss"]) and grad_gap <= 1e-3
        print(f"|  | chunked / plain | {chunked['peak_mib'] / plain['peak_mib']:.2f}x | "
              f"{chunked['seconds'] / plain['seconds']:.2f}x | {'equal' if agree else 'DIFFER'} "
              f"(gradient gap {grad_gap:.1e}) |")


if __name__ == "__main__":
    main()
