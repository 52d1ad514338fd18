"""The whole workflow on a GPU host, in minutes: control plane, upload, jobs, training, results.

Started by `GPU_SMOKE_WORKFLOW=1 bash benchmarks/gpu_smoke.sh` (which skips it on a machine without a
CUDA GPU; without the variable the script runs `benchmarks/gpu_cases.py` only). It
starts the control plane on the embedded defaults in a temporary home (SQLite, a local
folder, the local executor with one slot per GPU), registers two base models — the demo's
tiny random model, built here, and a ~0.5B instruct model (`--model`: a hub id, fetched once,
or a local folder) — and then, as a tenant would with the official `openai` SDK, uploads the
demo's data and runs one job per (model, training type, GPU count, strategy): LoRA, QLoRA and
full, on 1 GPU and on all of them — LoRA with DDP and with FSDP2, QLoRA with DDP, full with
FSDP2. Each job runs alone, to its end.

Printed per job: its status (or the API's refusal, e.g. a full fine-tune that does not fit the
GPU), steps, real tokens/s (median over its steps), MFU and peak GPU memory as the trainer
reports them in its `metrics` events, the held-out loss at the end and the wall time.

    GPU_SMOKE_WORKFLOW=1 bash benchmarks/gpu_smoke.sh                               # + Qwen2.5-0.5B-Instruct
    GPU_SMOKE_WORKFLOW=1 bash benchmarks/gpu_smoke.sh --model /models/qwen2.5-0.5b  # a local copy
    GPU_SMOKE_WORKFLOW=1 bash benchmarks/gpu_smoke.sh --tiny-only
    python benchmarks/gpu_smoke.py --cpu --tiny-only             # the same flow on CPU slots (no QLoRA)

Then the built-in inference engine on the GPU: for each base model, every fine-tuned LoRA model
of the run answers the same prompts, first one request at a time, then all at once from
concurrent clients (continuous batching, the adapters mixed in one batch); printed: aggregate
tokens/s of both, and how many greedy answers the batch left unchanged (bf16 kernels may round
differently at another batch size; on the CPU in float32 all must be equal).

Exits 1 when a job that was accepted did not succeed. QLoRA needs bitsandbytes: without it
those rows say so. MFU needs the GPU's peak bf16 TFLOP/s (a table of known GPUs, or
TUNEFORGE_GPU_PEAK_TFLOPS).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TERMINAL = ("succeeded", "failed", "cancelled")
TYPES = ("lora", "qlora", "full")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gpus(cpu: bool, asked: int | None) -> int:
    if asked:
        return asked
    if cpu:
        return 2
    import torch

    return torch.cuda.device_count()


def _has_bitsandbytes() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or installed without a usable CUDA build
        return False
    return True


def _metrics(api: Any, job_id: str) -> list[dict[str, Any]]:
    rows, after = [], None
    while True:
        page = api.fine_tuning.jobs.list_events(job_id, limit=100, **({"after": after} if after else {}))
        rows += [event.data or {} for event in page.data if event.type == "metrics"]
        if not page.has_more or not page.data:
            return rows
        after = page.data[-1].id


def _wait(api: Any, job_id: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        job = api.fine_tuning.jobs.retrieve(job_id)
        if job.status in TERMINAL:
            return job
        if time.monotonic() > deadline:
            api.fine_tuning.jobs.cancel(job_id)
            return api.fine_tuning.jobs.retrieve(job_id)
        time.sleep(2.0)


def _figure(values: list[float], fmt: str) -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    return format(statistics.median(values), fmt) if values else "—"


PROMPTS = ("What is the capital of France?", "Write a haiku about GPUs.", "Name three prime numbers.",
           "Translate 'good morning' into Spanish.")


def _batched_inference(api: Any, base: str, fine_tuned: list[str], new_tokens: int = 32) -> int:
    """The fine-tuned models (and the base) answer every prompt one at a time, then all at once;
    prints both throughputs and the answers the batch left unchanged. Returns 1 on an error."""
    from concurrent.futures import ThreadPoolExecutor

    requests = [(model, prompt) for model in [base, *fine_tuned] for prompt in PROMPTS]

    def ask(request: tuple[str, str]) -> tuple[str, int]:
        model, prompt = request
        reply = api.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=new_tokens, temperature=0)
        return reply.choices[0].message.content or "", reply.usage.completion_tokens

    try:
        ask(requests[0])  # loads the base and its adapters before the clock starts
        for model in fine_tuned:
            ask((model, PROMPTS[0]))
        started = time.monotonic()
        alone = [ask(request) for request in requests]
        alone_s = time.monotonic() - started
        started = time.monotonic()
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(ask, requests))
        together_s = time.monotonic() - started
    except Exception as exc:  # noqa: BLE001 - reported, and the smoke fails
        print(f"inference on {base}: {exc}")
        return 1
    same = sum(a[0] == b[0] for a, b in zip(alone, together))
    print(f"inference on {base}: {len(requests)} requests over the base and {len(fine_tuned)} adapter(s): one at a "
          f"time {sum(t for _, t in alone) / alone_s:.0f} tok/s, all at once "
          f"{sum(t for _, t in together) / together_s:.0f}"
          f" tok/s; {same}/{len(requests)} greedy answers unchanged by batching")
    return 0


def _layouts(kind: str, counts: list[int]) -> list[tuple[int, str | None]]:
    """(GPUs, strategy) to run a training type on: alone, then on every GPU with each strategy it takes
    (QLoRA cannot be sharded; a full fine-tune is sharded)."""
    shared = {"lora": ["ddp", "fsdp"], "qlora": ["ddp"], "full": ["fsdp"]}[kind]
    return [(count, None) if count == 1 else (count, strategy) for count in counts
            for strategy in ([None] if count == 1 else shared)]


def run(args: argparse.Namespace) -> int:
    import openai

    from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, write_demo_files
    from tuneforge.demo.tiny_model import build_tiny_model
    from tuneforge.server import ControlPlane
    from tuneforge.services.serving import base_models as base_model_service
    from tuneforge.services.tenancy import tenants as tenant_service
    from tuneforge.settings import Settings
    from tuneforge.storage import layout

    gpus = _gpus(args.cpu, args.gpus)
    counts = sorted({1, gpus})
    root = Path(tempfile.mkdtemp(prefix="tuneforge-gpu-smoke-"))
    settings = Settings(home=root, port=_free_port(), database_url=None, storage_url=None, local_gpus=gpus)
    models = {"tiny": str(build_tiny_model(root / "models" / "tiny"))}
    if not args.tiny_only:
        models["large"] = args.model
    files = write_demo_files(root / "data")
    bnb = _has_bitsandbytes()
    print(f"gpu smoke: {gpus} {'CPU slot(s)' if args.cpu else 'GPU(s)'}, models {models}, home {root}")
    rows: list[list[str]] = []
    failed = 0
    tuned: dict[str, list[str]] = {}  # base -> its LoRA fine-tuned models
    with ControlPlane(settings) as plane:
        with plane.platform.db.session() as session:
            _tenant, key = tenant_service.create_tenant(session, "smoke", "premium")
            for name, source in models.items():
                started = time.monotonic()
                base_model_service.add_base_model(session, plane.platform.store, name, source,
                                                  layout.hub_cache_dir(layout.local_cache_dir(settings.home)))
                print(f"registered {name} from {source} in {time.monotonic() - started:.0f} s")
        api = openai.OpenAI(base_url=f"{plane.url}/v1", api_key=key, max_retries=5)
        training = api.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
        validation = api.files.create(file=files.validation_path.open("rb"), purpose="fine-tune")
        for name in models:
            hyperparameters = dict(DEMO_HYPERPARAMETERS) if name == "tiny" else {"n_epochs": 1, "batch_size": 8}
            for kind in TYPES:
                for count, strategy in _layouts(kind, counts):
                    label = [name, kind, str(count), strategy or "—"]
                    if kind == "qlora" and (args.cpu or not bnb):
                        rows.append(label + ["skipped: " + ("needs CUDA" if args.cpu else "bitsandbytes not installed")]
                                    + [""] * 6)
                        continue
                    training_type = {"type": kind, **(DEMO_LORA if kind != "full" else {})}
                    started = time.monotonic()
                    try:
                        job = api.fine_tuning.jobs.create(
                            model=name, training_file=training.id, validation_file=validation.id, seed=0,
                            suffix=f"smoke-{kind}-{count}",
                            method={"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
                            extra_body={"training_type": training_type, "resources": {"gpus": count},
                                        **({"distributed": {"strategy": strategy}} if strategy else {})})
                    except openai.APIStatusError as exc:
                        rows.append(label + [f"refused {exc.status_code}: {exc.message[:80]}"] + [""] * 6)
                        continue
                    job = _wait(api, job.id, args.timeout)
                    metrics = _metrics(api, job.id)
                    wall = time.monotonic() - started
                    steps = max((m.get("step", 0) for m in metrics), default=0)
                    valid = [m["valid_loss"] for m in metrics if m.get("valid_loss") is not None]
                    rows.append(label + [job.status, str(steps),
                                         _figure([m.get("tokens_per_second") for m in metrics], ".0f"),
                                         _figure([m.get("mfu") for m in metrics], ".1%"),
                                         _figure([max((m.get("peak_memory_mb") or 0) for m in metrics)]
                                                 if metrics else [], ".0f"),
                                         f"{valid[-1]:.3f}" if valid else "—", f"{wall:.0f}"])
                    if job.status != "succeeded":
                        failed += 1
                        print(f"  {job.id} ({' '.join(label)}) ended {job.status}: {job.error}")
                    elif kind == "lora" and job.fine_tuned_model:
                        tuned.setdefault(name, []).append(job.fine_tuned_model)
        for name, fine_tuned in tuned.items():
            failed += _batched_inference(api, name, fine_tuned)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    header = ["model", "type", "gpus", "strategy", "status", "steps", "tokens/s", "MFU", "peak MB", "valid loss",
              "wall s"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("TUNEFORGE_SMOKE_MODEL", DEFAULT_MODEL),
                        help="The ~0.5B base model: a hub id or a local folder (TUNEFORGE_SMOKE_MODEL).")
    parser.add_argument("--tiny-only", action="store_true", help="Only the tiny model (no download).")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: every one visible).")
    parser.add_argument("--cpu", action="store_true", help="Run the flow on CPU slots (checks the script itself).")
    parser.add_argument("--timeout", type=float, default=1800.0, help="Seconds per job before it is cancelled.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary home (logs, artifacts).")
    args = parser.parse_args()
    sys.exit(run(args))


if __name__ == "__main__":
    main()
