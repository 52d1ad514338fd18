"""Fair shared inference, measured on this machine: another tenant's time to first token while one
tenant saturates the batch.

The demo's tiny Llama (the model the attack suite serves as `tiny-chat`) is put in a local object
store and served by `tuneforge.serve.engine.InferenceEngine` as the API serves it. The attacker
sends `--attack-requests` requests at once, each of `--choices` choices with `ignore_eos` and the
default max_tokens (every choice runs its full length), reserving n × max_tokens first as the
route does. Once the attacker's rows fill the batch, the bystander asks for one token, `--probes`
times one after the other; its time to first token is compared with the same request on the idle
engine.

Two engines in the same run:
- **fair** (the default now): the free tier's bound on tokens in flight (the attacker's excess
  requests are refused with 429) and fair admission (a tenant over its share of the rows has rows
  set aside for the tenants waiting);
- **unfair** (`fair=False`, no bound): plain round-robin over waiting requests and nothing set aside,
  as the engine served before; the bystander waits for an attacker row to end.

    python benchmarks/inference_fairness.py                 # ~1 min on 2 CPU cores
    python benchmarks/inference_fairness.py --probes 3      # a quick look

Nothing here asserts a time; everything stays in a temp folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from tuneforge.demo.tiny_model import build_tiny_model, count_parameters
from tuneforge.domain.errors import ApiError
from tuneforge.domain.spec import BaseModelRef
from tuneforge.serve.engine import InferenceEngine, TenantEngine
from tuneforge.serve.params import ModelTarget, Prompt, SamplingParams
from tuneforge.settings.serving import DEFAULT_TOKENS_IN_FLIGHT_BY_TIER
from tuneforge.storage import layout
from tuneforge.storage.store import open_store
from tuneforge.train.model import load_base_model

PROMPT = "Tell me a long story about load_data and parse_line."
SATURATION_WAIT_S = 30.0  # longest wait for the attacker's rows to fill the batch


def first_token_s(tenant: TenantEngine, target: ModelTarget, params: SamplingParams) -> float:
    """Seconds from submitting one request to its first chunk (its whole answer is read)."""
    sent_s = time.perf_counter()
    first = None
    for _chunk in tenant.submit(target, Prompt(text=PROMPT), params):
        if first is None:
            first = time.perf_counter() - sent_s
    assert first is not None
    return first


def attack(attacker: TenantEngine, target: ModelTarget, requests: int, choices: int, params: SamplingParams
           ) -> tuple[list[threading.Thread], dict[str, int]]:
    """The attacker's requests, each reserving all its choices and reading them on threads."""
    outcome = {"served": 0, "refused": 0, "tokens": 0}
    lock = threading.Lock()
    threads: list[threading.Thread] = []

    def read(sink) -> None:  # noqa: ANN001 - a serve.sinks.Sink
        completion = sink.completion()
        with lock:
            outcome["tokens"] += completion.usage.completion_tokens

    for _ in range(requests):
        try:
            with attacker.reserve(params.max_new_tokens, choices) as lease:
                sinks = [attacker.under(lease).submit(target, Prompt(text=PROMPT), params) for _ in range(choices)]
        except ApiError as refusal:
            assert refusal.status_code == 429, refusal
            outcome["refused"] += 1
            continue
        outcome["served"] += 1
        threads += [threading.Thread(target=read, args=(sink,)) for sink in sinks]
    for thread in threads:
        thread.start()
    return threads, outcome


def run(engine: InferenceEngine, target: ModelTarget, args: argparse.Namespace, bound: int | None) -> dict:
    attacker = engine.for_tenant("attacker", bound)
    bystander = engine.for_tenant("bystander")
    one_token = SamplingParams(max_new_tokens=1, temperature=0.0)
    for _ in range(3):  # loads the model, and the first passes' one-off costs
        first_token_s(bystander, target, one_token)
    alone = [first_token_s(bystander, target, one_token) for _ in range(args.probes)]
    long_rows = SamplingParams(max_new_tokens=args.max_tokens, ignore_eos=True)
    started_s = time.perf_counter()
    threads, outcome = attack(attacker, target, args.attack_requests, args.choices, long_rows)
    deadline_s = time.monotonic() + SATURATION_WAIT_S
    while next(iter(engine.load().values()), {}).get("running", 0) < engine.max_batch:
        assert time.monotonic() < deadline_s, "the attacker's rows never filled the batch"
        time.sleep(0.005)
    saturated = []
    for _ in range(args.probes):
        saturated.append(first_token_s(bystander, target, one_token))
        time.sleep(args.probe_gap_s)
    still_running = sum(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started_s
    return {"alone": alone, "saturated": saturated, "still_running": still_running, **outcome,
            "attacker_tokens_per_s": outcome["tokens"] / wall_s, "preemptions": engine.stats()["preemptions"]}


def show(label: str, result: dict) -> None:
    alone, saturated = result["alone"], result["saturated"]
    print(f"  {label:<8} bystander first token alone p50 {statistics.median(alone) * 1000:7.1f} ms | saturated "
          f"p50 {statistics.median(saturated) * 1000:8.1f} ms max {max(saturated) * 1000:8.1f} ms "
          f"({result['still_running']} attacker rows still running at the last probe) | attacker "
          f"{result['served']} served {result['refused']} refused, {result['attacker_tokens_per_s']:.0f} tok/s, "
          f"{result['preemptions']} rows set aside")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack-requests", type=int, default=6)
    parser.add_argument("--choices", type=int, default=8, help="n of each attacker request")
    parser.add_argument("--max-tokens", type=int, default=256, help="each attacker choice's tokens (the default)")
    parser.add_argument("--max-batch", type=int, default=16, help="the engine's max_batch (the default)")
    parser.add_argument("--probes", type=int, default=5, help="bystander requests, alone and under saturation")
    parser.add_argument("--probe-gap-s", type=float, default=0.05)
    parser.add_argument("--tier", default="free", help="the attacker's tier (its bound on tokens in flight)")
    parser.add_argument("--modes", default="unfair,fair", help="engines to run, in this order (comma-separated)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tuneforge-bench-fairness-"))
    try:
        base_dir = build_tiny_model(root / "base")
        plain, _tokenizer = load_base_model(base_dir, torch.device("cpu"))
        print(f"model: the demo's tiny Llama, {count_parameters(plain) / 1e6:.2f} M parameters, float32 on CPU; "
              f"torch threads {torch.get_num_threads()}, {os.cpu_count()} cores, load "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        del plain
        store = open_store(str(root / "objects"))
        base_ref = BaseModelRef("tiny-chat", "0" * 64, layout.base_model_prefix("tiny-chat", "0" * 64))
        store.upload_dir(base_dir, base_ref.prefix)
        target = ModelTarget("tiny-chat", base_ref)
        bound = DEFAULT_TOKENS_IN_FLIGHT_BY_TIER[args.tier]
        print(f"attacker: {args.attack_requests} requests x n={args.choices} x {args.max_tokens} tokens, ignore_eos; "
              f"bystander: 1 token; max_batch {args.max_batch}")
        for label in args.modes.split(","):
            fair = {"fair": True, "unfair": False}[label]
            engine = InferenceEngine(store, cache_dir=root / "cache", device="cpu", max_batch=args.max_batch,
                                     fair=fair)
            show(label, run(engine, target, args, bound if fair else None))
            del engine
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
