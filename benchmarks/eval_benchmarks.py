"""Benchmark-task throughput of the post-training eval: batched against one sequence at a time,
in the same run, on random-weight Llamas, and a GPU estimate for a 7B from the measured figures.

Three synthetic tasks in lm-eval's format are written to a temporary benchmark folder and read
with the platform's reader (`eval/benchmarks.py`), so the contexts are what a real run builds:

- **mc-words**: multiple choice whose choices are several tokens (as ARC, HellaSwag): every
  (context, choice) pair is its own sequence;
- **mc-letters**: multiple choice whose choices are one token each (as MMLU's " A".." D"): one
  sequence per question, every choice read off its last position;
- **gen**: greedy generation of `--gen-tokens` tokens per prompt (as GSM8K, with no stop string
  so every prompt decodes the same length).

Each task runs with `--batch` sequences per forward pass and with 1, on each model: the demo's
tiny model and a ~0.1 B one (`--big-*`). Figures: examples/s, tokens/s (tokens fed to the model,
padding not counted; for gen, prompt plus generated tokens), and the achieved FLOP/s from the
model's forward FLOPs per token (2 x parameters + attention). Batched and unbatched scores are
checked to agree. The GPU estimate scales the tokens an eval feeds a 7B with stated assumptions
(printed with the figures); docs/eval.md records a run.

    python benchmarks/eval_benchmarks.py                 # ~6 min on 2 CPU cores
    python benchmarks/eval_benchmarks.py --questions 16 --big-layers 4   # a quick look
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package

from harness import torch_machine_line  # noqa: E402

from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.eval import benchmarks
from tuneforge.train import benchmark_runner

CPU = torch.device("cpu")
WORDS = ("apple river cloud stone tiger piano candle mirror garden window forest engine silver market "
         "winter harbor planet castle rocket valley").split()

# The 7B the estimate is for (Llama-2-7B's shape) and the standard task sizes.
SEVEN_B = {"params": 6.74e9, "layers": 32, "hidden": 4096, "weight_bytes": 6.74e9 * 2}
MMLU = {"questions": 14_042, "context_tokens_5shot": 600, "context_tokens_0shot": 150}
GSM8K = {"prompts": 1_319, "new_tokens": 256, "prompt_tokens_5shot": 900}
GPUS = {"A100-80GB": {"bf16_flops": 312e12, "hbm_bytes_s": 2.0e12},
        "H100-SXM": {"bf16_flops": 989e12, "hbm_bytes_s": 3.35e12}}
MFU = 0.40  # share of peak a batched bf16 forward reaches on long sequences (prefill-like)
DECODE_EFFICIENCY = 0.6  # share of HBM bandwidth a decode step reaches reading the weights


def write_tasks(root: Path, questions: int, choices: int, shots: int, gen_tokens: int,
                letters: tuple[str, ...]) -> None:
    rng = random.Random(0)
    docs = []
    for number in range(questions + shots + 1):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 30)))
        options = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(choices)]
        docs.append({"question": f"{number}: {words}?", "choices": options, "letters": list(letters[:choices]),
                     "label": rng.randrange(choices), "answer": rng.choice(WORDS)})
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "test.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:questions]))
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[questions:]))
    common = ("dataset_path: json\ndataset_kwargs: {data_files: {test: data/test.jsonl, train: data/train.jsonl}}\n"
              f"test_split: test\nfewshot_split: train\nnum_fewshot: {shots}\n")
    (root / "mc_words.yaml").write_text(
        "task: mc-words\n" + common + "output_type: multiple_choice\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_target: label\ndoc_to_choice: choices\n"
        "metric_list: [{metric: acc}, {metric: acc_norm}]\n")
    (root / "mc_letters.yaml").write_text(
        "task: mc-letters\n" + common + "output_type: multiple_choice\n"
        "doc_to_text: \"{{question}}\\n{% for c in choices %}{{letters[loop.index0]}}. {{c}}\\n{% endfor %}"
        "Answer:\"\ndoc_to_target: label\ndoc_to_choice: letters\nmetric_list: [{metric: acc}]\n")
    (root / "gen.yaml").write_text(
        "task: gen\n" + common.replace(f"num_fewshot: {shots}", "num_fewshot: 1") + "output_type: generate_until\n"
        "doc_to_text: \"Q: {{question}}\\nA:\"\ndoc_to_target: \" {{answer}}\"\n"
        f"generation_kwargs: {{until: [], max_gen_toks: {gen_tokens}}}\n")


def single_token_letters(tokenizer, count: int) -> tuple[str, ...]:
    """Words the tokenizer encodes as one token after a space (the tiny BPE splits " A" in two)."""
    found = []
    for word in WORDS + ["the", "no", "is", "a", "of", "in", "it", "on", "at", "be"]:
        if len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1:
            found.append(word)
    if len(found) < count:
        raise SystemExit(f"the tokenizer has only {len(found)} single-token words; lower --choices")
    return tuple(found[:count])


def forward_flops_per_token(model, context_tokens: float) -> float:
    config = model.config
    dense = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    return 2 * dense + 2 * config.num_hidden_layers * context_tokens * config.hidden_size


def measure(model, tokenizer, task, batch: int) -> dict:
    started = time.perf_counter()
    if task.output_type == "multiple_choice":
        scores = benchmark_runner.loglikelihoods(model, tokenizer, CPU, task, batch_size=batch)
        seconds = time.perf_counter() - started
        pairs = benchmark_runner._pairs(task, tokenizer, benchmark_runner.MAX_CONTEXT_TOKENS)
        tokens = sum(len(p.tokens) for p in pairs)
        result = benchmarks.choice_scores(task, scores)
        context = tokens / max(1, len(pairs))
    else:
        texts = benchmark_runner.generations(model, tokenizer, CPU, task, batch_size=batch)
        seconds = time.perf_counter() - started
        prompt = sum(len(tokenizer(r.context)["input_ids"]) for r in task.requests)
        tokens = prompt + sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        result = {"texts": texts}
        context = prompt / len(task.requests) + task.max_gen_toks / 2
    flops = forward_flops_per_token(model, context / 2)
    return {"seconds": seconds, "examples_s": len(task.requests) / seconds, "tokens_s": tokens / seconds,
            "tokens_per_example": tokens / len(task.requests), "gflops_s": tokens * flops / seconds / 1e9,
            "result": result}


def run_model(label: str, path: Path, root: Path, args) -> None:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    print(f"\n## {label}: {params / 1e6:.1f} M parameters, {model.config.num_hidden_layers} layers, "
          f"hidden {model.config.hidden_size}")
    print(f"{'task':<11} {'batch':>5} {'examples':>8} {'tok/ex':>7} {'s':>7} {'ex/s':>8} {'tok/s':>8} "
          f"{'GFLOP/s':>8} {'speed-up':>8}")
    for name in ("mc-words", "mc-letters", "gen"):
        task = benchmarks.load_named(root, name)
        figures = {batch: measure(model, tokenizer, task, batch) for batch in (1, args.batch)}
        one, many = figures[1], figures[args.batch]
        if task.output_type == "multiple_choice":
            assert one["result"] == many["result"], (one["result"], many["result"])
        for batch, seen in figures.items():
            print(f"{name:<11} {batch:>5} {len(task.requests):>8} {seen['tokens_per_example']:>7.0f} "
                  f"{seen['seconds']:>7.1f} {seen['examples_s']:>8.2f} {seen['tokens_s']:>8.0f} "
                  f"{seen['gflops_s']:>8.1f} {one['seconds'] / seen['seconds']:>7.1f}x")


def gpu_estimate() -> None:
    flops_token = lambda context: 2 * SEVEN_B["params"] + 2 * SEVEN_B["layers"] * context * SEVEN_B["hidden"]  # noqa: E731
    print("\n## GPU estimate for a 7B (base and fine-tuned model, both scored)")
    print(f"assumptions: Llama-2-7B shape ({SEVEN_B['params'] / 1e9:.2f} B params, {SEVEN_B['layers']} layers, "
          f"hidden {SEVEN_B['hidden']}), bf16; scoring forwards reach {MFU:.0%} of peak; decoding reads the "
          f"weights once per step at {DECODE_EFFICIENCY:.0%} of HBM bandwidth (batch {64}); MMLU "
          f"{MMLU['questions']} questions, one-token letters (one sequence per question), contexts "
          f"~{MMLU['context_tokens_5shot']} tokens 5-shot / ~{MMLU['context_tokens_0shot']} 0-shot; GSM8K "
          f"{GSM8K['prompts']} prompts, ~{GSM8K['prompt_tokens_5shot']} prompt tokens 5-shot, up to "
          f"{GSM8K['new_tokens']} new tokens")
    for gpu, spec in GPUS.items():
        rate = spec["bf16_flops"] * MFU
        rows = []
        for label, context in (("MMLU 5-shot", MMLU["context_tokens_5shot"]),
                               ("MMLU 0-shot", MMLU["context_tokens_0shot"])):
            tokens = MMLU["questions"] * context
            rows.append((label, tokens, 2 * tokens * flops_token(context / 2) / rate))
        prefill = GSM8K["prompts"] * GSM8K["prompt_tokens_5shot"]
        steps = -(-GSM8K["prompts"] // 64) * GSM8K["new_tokens"]
        decode = steps * SEVEN_B["weight_bytes"] / (spec["hbm_bytes_s"] * DECODE_EFFICIENCY)
        rows.append(("GSM8K 5-shot", prefill, 2 * (prefill * flops_token(GSM8K["prompt_tokens_5shot"] / 2) / rate
                                                   + decode)))
        for label, tokens, seconds in rows:
            print(f"{gpu:<10} {label:<13} {tokens / 1e6:6.2f} M tokens/model  {seconds / 60:6.1f} min for both models")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=32, help="documents per task")
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--shots", type=int, default=3, help="few-shot examples in each context")
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16, help="sequences per forward pass (the batched side)")
    parser.add_argument("--big-hidden", type=int, default=768)
    parser.add_argument("--big-layers", type=int, default=12)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(torch_machine_line() + f", torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory(prefix="tf-eval-bench-") as tmp:
        tmp_path = Path(tmp)
        tiny = build_tiny_model(tmp_path / "tiny", seed=0)
        big = build_tiny_model(tmp_path / "big", seed=0, hidden_size=args.big_hidden,
                               intermediate_size=args.big_hidden * 8 // 3, num_hidden_layers=args.big_layers,
                               num_attention_heads=args.big_hidden // 64, num_key_value_heads=args.big_hidden // 192,
                               max_position_embeddings=4096, lm_head_init_std=0.02)
        letters = single_token_letters(AutoTokenizer.from_pretrained(tiny), args.choices)
        write_tasks(tmp_path / "tasks", args.questions, args.choices, args.shots, args.gen_tokens, letters)
        for label, path in (("tiny", tiny), ("~0.1B", big)):
            run_model(label, path, tmp_path / "tasks", args)
    gpu_estimate()


if __name__ == "__main__":
    main()
