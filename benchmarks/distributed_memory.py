"""Memory of one training process on each distributed path, on this machine's CPU: one
process alone, two DDP ranks, two FSDP2 ranks — for a full fine-tune and for LoRA — measured
against what the memory model (`planning/memory.py`) predicts for the same job.

Each layout runs in processes of its own, in torchrun's environment, joined and wrapped by the
trainer's own code (`train/distributed.py`: `join`, `Dist.wrap`, `Dist.accumulating`,
`Dist.clip_grad_norm`): a random-weight Llama is built (same seed everywhere), then
STEPS AdamW steps of MICRO micro-batches each run on random tokens, as the training loop runs
them. Every rank reports, above its RSS just before the model was built (glibc's mmap
threshold pinned so that freed tensors leave RSS): its peak while training (RSS sampled
every millisecond by a thread during the steps) and its peak overall (`ru_maxrss`, which
also holds the whole model each rank builds before it is sharded), and the mean step time. \
The baseline is the single process: its peak is what every DDP rank also holds;
FSDP2's should be about the sharded part (weights, gradients, optimizer states) divided by
the ranks plus what is not sharded (activations, a gathered layer).

    python benchmarks/distributed_memory.py
    python benchmarks/distributed_memory.py --hidden 512 --vocab 16000   # smaller and quicker
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_port, torch_machine_line  # noqa: E402 - benchmarks/ is not a package

LAYOUTS = (("single", 1), ("ddp", 2), ("fsdp", 2))
TYPES = ("full", "lora")


def _config(args: argparse.Namespace):  # noqa: ANN202
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                       num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 11 // 4,
                       vocab_size=args.vocab, max_position_embeddings=args.seq_len)


def _rss_kib() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class _Sampler(threading.Thread):
    """The highest RSS seen while it runs, read every millisecond."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.done = 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.peak = max(self.peak, _rss_kib())


def child(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from tuneforge.domain.spec import LoraConfig
    from tuneforge.train import distributed
    from tuneforge.train.model import prepare_trainable, trainable_parameters

    torch.set_num_threads(1)
    strategy, training_type = args.child
    device = torch.device("cpu")
    dist = distributed.join(device, "" if strategy == "single" else strategy)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(args), attn_implementation="sdpa")
    model = prepare_trainable(model, training_type, LoraConfig(rank=16, alpha=32, dropout=0.0), seed=0)
    model = dist.wrap(model)
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    generator = torch.Generator().manual_seed(1 + dist.rank)
    losses, times = [], []
    sampler = _Sampler()
    sampler.start()
    for _step in range(args.steps):
        started = time.perf_counter()
        total = 0.0
        for micro in range(args.micro):
            ids = torch.randint(0, args.vocab, (1, args.seq_len), generator=generator)
            with dist.accumulating(model, last=micro == args.micro - 1):
                loss = model(input_ids=ids, labels=ids).loss
                (loss / args.micro).backward()  # each rank's mean; the strategies average over ranks
            total += float(loss)
        dist.clip_grad_norm(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
        losses.append(total / args.micro)
    sampler.done.set()
    sampler.join()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    parameters = sum(p.numel() for p in model.parameters())
    dist.close()
    return {"rank": dist.rank, "peak_mib": round((peak - before) / 1024, 1), "parameters": parameters,
            "training_mib": round((sampler.peak - before) / 1024, 1),
            "step_s": round(sum(times[1:] or times) / len(times[1:] or times), 3), "loss": losses[-1]}


def measure(args: argparse.Namespace, strategy: str, world: int, training_type: str) -> list[dict]:
    from tuneforge.train.distributed import rendezvous_env

    port = free_port()
    command = [sys.executable, __file__, "--child", strategy, training_type,
               *[f"--{name}={getattr(args, name.replace('-', '_'))}"
                 for name in ("hidden", "layers", "vocab", "seq-len", "steps", "micro")]]
    procs = []
    for rank in range(world):
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
        if world > 1:
            env.update(rendezvous_env(rank, world, rank, world, "127.0.0.1", port))
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{strategy} {training_type}: {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def predicted_mib(args: argparse.Namespace, training_type: str, shards: int) -> float:
    from tuneforge.planning import memory

    shape = memory.ModelShape.from_config(_config(args).to_dict())
    estimate = memory.estimate(shape, training_type=training_type, micro_batch_size=1, seq_len=args.seq_len,
                               weight_bytes=4, device="cpu", shards=shards, lora_rank=16)
    return estimate.total_bytes / memory.MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro", type=int, default=2, help="Micro-batches (of one row) a step on each rank.")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    print(torch_machine_line())
    print(f"model: Llama, hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}; fp32 on CPU, AdamW; "
          f"{args.micro} micro-batches of 1 x {args.seq_len} tokens a step on each rank, {args.steps} steps; "
          "1 thread a rank\n")
    print("| training | layout | training peak MiB a rank | vs one process | memory model MiB | "
          "peak with loading MiB | step s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for training_type in TYPES:
        alone = None
        for strategy, world in LAYOUTS:
            ranks = measure(args, strategy, world, training_type)
            training = max(r["training_mib"] for r in ranks)
            alone = alone or training
            shards = world if strategy == "fsdp" else 1
            print(f"| {training_type} | {strategy} x{world} | {training:.0f} | {training / alone:.2f}x | "
                  f"{predicted_mib(args, training_type, shards):.0f} | {max(r['peak_mib'] for r in ranks):.0f} | "
                  f"{max(r['step_s'] for r in ranks):.2f} |")


if __name__ == "__main__":
    main()
