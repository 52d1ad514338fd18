"""Inference with hot-swapped adapters and continuous batching, measured on this machine.

A random-weight Llama of a few million parameters with a real byte-level BPE
tokenizer (`tuneforge.demo.tiny_model.build_tiny_model`, a larger
configuration) and 8 LoRA adapters with random non-zero weights on every
linear layer are put into a local object store, then served by
`tuneforge.serve.engine.InferenceEngine` exactly as the API serves them:

- **batched multi-adapter serving**: 32 concurrent clients, each request for
  one of the 8 adapters in turn, served by the engine with continuous batching
  (every running sequence in one forward pass, each row through its own
  adapter via the stacked adapters of `serve/lora_bank.py`) against the same engine with `max_batch=1` (one request at
  a time, as it served before batching): aggregate tokens/s, time to first
  token p50 / p99, and the mean batch size;
- **generation throughput** (completion tokens / wall time, greedy, a fixed
  number of new tokens per request), for requests that all use the base alone,
  all use one adapter, or go round-robin over the 8 adapters on the one base
  (every request switches);
- **LRU misses**: round-robin over the 8 adapters with room for only 2, so
  every request deletes one adapter and loads another from the local cache;
- **the baseline without hot-swap**: each request loads the base model and its
  adapter from local disk (`from_pretrained` + `PeftModel.from_pretrained`),
  then generates the same tokens.

    python benchmarks/inference.py                 # ~4 min on 2 CPU cores
    python benchmarks/inference.py --requests 8 --clients 8    # a quick look

Nothing here asserts a time; everything stays in a temp folder.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

import torch

from tuneforge.demo.tiny_model import build_tiny_model, count_parameters
from tuneforge.domain.spec import BaseModelRef
from tuneforge.serve.engine import InferenceEngine
from tuneforge.serve.params import ModelTarget, Prompt, SamplingParams
from tuneforge.storage import layout
from tuneforge.storage.store import ObjectStore, open_store
from tuneforge.train.model import linear_module_names, load_base_model

PROMPT = "Tell me about load_data. What is the code for parse_line? def build_index(items):\n    return"


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu,
        "logical cores": str(os.cpu_count()), "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__, "transformers": metadata.version("transformers"),
        "peft": metadata.version("peft"), "load average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def save_adapter(base_dir: Path, out_dir: Path, *, seed: int, rank: int) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=linear_module_names(model),
                        init_lora_weights=False, task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    get_peft_model(model, config).save_pretrained(out_dir)
    return out_dir


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def run_requests(engine: InferenceEngine, targets: list[ModelTarget], params: SamplingParams) -> dict[str, float]:
    """The targets one after the other; tokens/s over the whole run and latency per request."""
    latencies_s, tokens = [], 0
    started_s = time.perf_counter()
    for target in targets:
        request_started_s = time.perf_counter()
        completion = engine.complete(target, Prompt(text=PROMPT), params)
        latencies_s.append(time.perf_counter() - request_started_s)
        tokens += completion.usage.completion_tokens
    wall_s = time.perf_counter() - started_s
    return {"tokens_per_s": tokens / wall_s, "p50_s": statistics.median(latencies_s),
            "p95_s": percentile(latencies_s, 0.95), "tokens": tokens, "requests": len(targets)}


def run_concurrent(engine: InferenceEngine, targets: list[ModelTarget], params: SamplingParams, clients: int,
                   per_client: int) -> dict[str, float]:
    """`clients` threads, each sending `per_client` requests one after the other (request i of
    client c for target (c + i) mod len(targets)); aggregate tokens/s and time to first token."""
    first_token_s: list[float] = []
    tokens = [0] * clients
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client(number: int) -> None:
        start.wait()
        for index in range(per_client):
            target = targets[(number + index) % len(targets)]
            sent_s = time.perf_counter()
            first = None
            for chunk in engine.submit(target, Prompt(text=PROMPT), params):
                if first is None:
                    first = time.perf_counter() - sent_s
                if chunk.usage is not None:
                    tokens[number] += chunk.usage.completion_tokens
            with lock:
                first_token_s.append(first)

    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    started_s = time.perf_counter()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started_s
    stats = engine.stats()
    return {"tokens_per_s": sum(tokens) / wall_s, "ttft_p50_s": percentile(first_token_s, 0.5),
            "ttft_p99_s": percentile(first_token_s, 0.99), "tokens": sum(tokens), "wall_s": wall_s,
            "mean_batch": stats["decoded_rows"] / max(1, stats["decode_steps"]),
            "largest_batch": stats["largest_batch"]}


def from_scratch(base_dir: Path, adapter_dir: Path, params: SamplingParams) -> tuple[float, float]:
    """The baseline: (load seconds, request seconds) when a request loads base and adapter itself."""
    from peft import PeftModel

    from tuneforge.serve.engine import eos_ids
    from tuneforge.serve.generation import SequenceDecoder, prompt_token_ids

    started_s = time.perf_counter()
    model, tokenizer = load_base_model(base_dir, torch.device("cpu"))
    model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    loaded_s = time.perf_counter() - started_s
    ids = prompt_token_ids(tokenizer, Prompt(text=PROMPT), "bench")
    decoder = SequenceDecoder(tokenizer, ids, params, eos_ids=eos_ids(model, tokenizer), device=torch.device("cpu"))
    inputs, cache = torch.tensor([ids]), None
    with torch.inference_mode():
        while not decoder.done:
            output = model(input_ids=inputs, past_key_values=cache, use_cache=True)
            cache = output.past_key_values
            token, _chunks = decoder.step(output.logits[0, -1])
            if token is None:
                break
            inputs = torch.tensor([[token]])
    return loaded_s, time.perf_counter() - started_s


def print_run(label: str, result: dict[str, float]) -> None:
    print(f"  {label:<34} {result['tokens_per_s']:7.1f} tok/s   request p50 {result['p50_s'] * 1000:7.1f} ms"
          f"   p95 {result['p95_s'] * 1000:7.1f} ms   ({result['requests']} requests, {result['tokens']} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=704)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=24, help="requests per throughput scenario")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--scratch-requests", type=int, default=4, help="requests of the from-scratch baseline")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients of the batching comparison")
    parser.add_argument("--per-client", type=int, default=2, help="requests each concurrent client sends")
    parser.add_argument("--max-batch", type=int, default=32, help="the batched engine's max_batch")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default). On a CPU shared with other work, 1 avoids the "
                             "stalls of threads waiting for each other")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    root = Path(tempfile.mkdtemp(prefix="tuneforge-bench-inference-"))
    try:
        print("machine:")
        for key, value in machine_info().items():
            print(f"  {key:<14} {value}")
        base_dir = build_tiny_model(root / "base", vocab_size=args.vocab, hidden_size=args.hidden,
                                    intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
        plain, _tokenizer = load_base_model(base_dir, torch.device("cpu"))
        print(f"model: {count_parameters(plain) / 1e6:.2f} M parameters (hidden {args.hidden}, "
              f"{args.layers} layers, vocabulary {plain.config.vocab_size}), float32 on CPU")
        del plain
        adapter_dirs = [save_adapter(base_dir, root / f"adapter-{i}", seed=i, rank=args.rank)
                        for i in range(args.adapters)]
        adapter_bytes = sum(p.stat().st_size for p in adapter_dirs[0].rglob("*.safetensors"))
        print(f"adapters: {args.adapters} x LoRA rank {args.rank} on every linear layer, "
              f"{adapter_bytes / 1e6:.2f} MB each")

        store = open_store(str(root / "objects"))
        base_ref = BaseModelRef("bench-base", "0" * 64, layout.base_model_prefix("bench-base", "0" * 64))
        store.upload_dir(base_dir, base_ref.prefix)
        base = ModelTarget("bench-base", base_ref)
        tuned = []
        for i, adapter_dir in enumerate(adapter_dirs):
            prefix = layout.artifact_prefix("bench", f"ftjob-{i}", "adapter")
            store.upload_dir(adapter_dir, prefix)
            tuned.append(ModelTarget(f"ft:bench-base:bench::{i}", base_ref, artifact_prefix=prefix))
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
        measure(args, root, store, base, tuned, params, base_dir, adapter_dirs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(args: argparse.Namespace, root: Path, store: ObjectStore, base: ModelTarget, tuned: list[ModelTarget],
            params: SamplingParams, base_dir: Path, adapter_dirs: list[Path]) -> None:
    engine = InferenceEngine(store, cache_dir=root / "cache", device="cpu", max_adapters=args.adapters)
    started_s = time.perf_counter()
    engine.complete(base, Prompt(text=PROMPT), SamplingParams(max_new_tokens=1))
    print(f"\nbase load (store -> local cache -> memory): {time.perf_counter() - started_s:.3f} s")
    first_loads_s = []
    for target in tuned:  # first use: download + load_adapter
        started_s = time.perf_counter()
        engine.complete(target, Prompt(text=PROMPT), SamplingParams(max_new_tokens=1))
        first_loads_s.append(time.perf_counter() - started_s)
    print(f"first request per adapter (download + load + 1 token): p50 {statistics.median(first_loads_s) * 1000:.1f}"
          f" ms, max {max(first_loads_s) * 1000:.1f} ms")

    print(f"\n{args.clients} concurrent clients x {args.per_client} requests, {len(tuned)} adapters in turn, "
          f"{args.new_tokens} new tokens each, greedy:")
    concurrent = {}
    for label, max_batch in (("one at a time (max_batch=1)", 1), (f"batched (max_batch={args.max_batch})",
                                                                   args.max_batch)):
        served = InferenceEngine(store, cache_dir=root / "cache", device="cpu", max_adapters=args.adapters,
                                 max_batch=max_batch, max_queue=4 * args.clients)
        for target in tuned:  # loaded before the clock starts, in both
            served.complete(target, Prompt(text=PROMPT), SamplingParams(max_new_tokens=1))
        result = run_concurrent(served, tuned, params, args.clients, args.per_client)
        concurrent[max_batch] = result
        print(f"  {label:<30} {result['tokens_per_s']:8.1f} tok/s   first token p50 "
              f"{result['ttft_p50_s'] * 1000:8.1f} ms  p99 {result['ttft_p99_s'] * 1000:8.1f} ms   mean batch "
              f"{result['mean_batch']:5.1f} (largest {result['largest_batch']}), {result['tokens']} tokens in "
              f"{result['wall_s']:.1f} s")
        del served
    print("  batched / one at a time: "
          f"{concurrent[args.max_batch]['tokens_per_s'] / concurrent[1]['tokens_per_s']:.1f}x"
          " aggregate tokens/s")

    n = args.requests
    print(f"\nthroughput, {args.new_tokens} new tokens per request, greedy, one request at a time:")
    results = {
        "base only": run_requests(engine, [base] * n, params),
        "one adapter": run_requests(engine, [tuned[0]] * n, params),
        f"round-robin over {len(tuned)} adapters": run_requests(
            engine, [tuned[i % len(tuned)] for i in range(n)], params),
    }
    for label, result in results.items():
        print_run(label, result)

    small = InferenceEngine(store, cache_dir=root / "cache", device="cpu", max_adapters=2)
    miss = run_requests(small, [tuned[i % len(tuned)] for i in range(n)], params)
    stats = small.stats()
    print_run("LRU of 2, round-robin over 8", miss)
    print(f"    {stats['adapter_loads']} adapter loads, {stats['adapter_evictions']} evictions, "
          f"{stats['base_loads']} base load")

    loads_s, requests_s = [], []
    for i in range(args.scratch_requests):
        load_s, request_s = from_scratch(base_dir, adapter_dirs[i % len(adapter_dirs)], params)
        loads_s.append(load_s)
        requests_s.append(request_s)
    print(f"\nbaseline, base + adapter loaded per request ({args.scratch_requests} requests): load p50 "
          f"{statistics.median(loads_s) * 1000:.1f} ms, request p50 {statistics.median(requests_s) * 1000:.1f} ms, "
          f"{args.new_tokens / statistics.median(requests_s):.1f} tok/s")
    hot = results[f"round-robin over {len(tuned)} adapters"]
    print(f"hot-swap round-robin request p50 {hot['p50_s'] * 1000:.1f} ms: "
          f"{statistics.median(requests_s) / hot['p50_s']:.1f}x faster than the baseline")
    print(f"\nload average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
