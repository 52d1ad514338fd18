"""`tuneforge demo`: the whole product in one command, on a CPU, in minutes.

Builds a tiny model with a real tokenizer, starts the control plane on the
embedded defaults (SQLite, local folder, local executor), creates a tenant,
registers the base model, and then acts as a tenant would with the official
`openai` SDK: upload, create a job, follow it, download the adapter, and
compare the base model's answers with the fine-tuned one's.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

import httpx
import openai
from rich.console import Console
from rich.table import Table

from tuneforge.demo.dataset import DEMO_HYPERPARAMETERS, DEMO_LORA, DEMO_QUESTION, demo_facts, write_demo_files
from tuneforge.demo.evaluate import ask_code, load_finetuned, mapping_accuracy
from tuneforge.demo.tiny_model import build_tiny_model
from tuneforge.server import ControlPlane
from tuneforge.services.serving import base_models as base_model_service
from tuneforge.services.tenancy import tenants as tenant_service
from tuneforge.services.training.artifacts import extract
from tuneforge.settings import Settings
from tuneforge.storage import layout

console = Console()
BASE_MODEL = "tiny-chat"
TERMINAL = ("succeeded", "failed", "cancelled")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _follow(api: openai.OpenAI, job_id: str, timeout_s: float) -> openai.types.fine_tuning.FineTuningJob:
    deadline, last_status, last_step = time.monotonic() + timeout_s, None, -1
    while True:
        job = api.fine_tuning.jobs.retrieve(job_id)
        if job.status != last_status:
            console.print(f"  status: [bold]{job.status}[/bold]")
            last_status = job.status
        for event in api.fine_tuning.jobs.list_events(job_id, limit=5).data:
            data = event.data or {}
            if event.type == "metrics" and data.get("step", -1) > last_step:
                last_step = data["step"]
                if last_step % 10 == 0 or last_step == data.get("total_steps"):
                    console.print(f"  step {last_step}/{data.get('total_steps')}  loss {data.get('train_loss', 0):.4f}"
                                  f"  {data.get('tokens_per_second', 0):.0f} tok/s")
                break
        if job.status in TERMINAL or time.monotonic() > deadline:
            return job
        time.sleep(1.0)


def _quiet_libraries() -> None:
    """The demo prints its own story; library progress bars would drown it."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def run_demo(home: str | None = None, *, timeout_s: float = 600.0) -> int:
    started = time.monotonic()
    _quiet_libraries()
    root = Path(home) if home else Settings().home / "demo"
    shutil.rmtree(root, ignore_errors=True)
    settings = Settings(home=root, port=_free_port(), database_url=None, storage_url=None)
    console.rule("tuneforge demo")
    model_dir = build_tiny_model(root / "models" / BASE_MODEL)
    files = write_demo_files(root / "data")
    with ControlPlane(settings) as plane:
        with plane.platform.db.session() as session:
            _tenant, api_key = tenant_service.create_tenant(session, "demo")
            base_model_service.add_base_model(session, plane.platform.store, BASE_MODEL, str(model_dir),
                                              layout.hub_cache_dir(layout.local_cache_dir(settings.home)))
        console.print(f"control plane on {plane.url}; tenant 'demo'; base model '{BASE_MODEL}' "
                      f"({sum(1 for _ in model_dir.iterdir())} files)")
        api = openai.OpenAI(base_url=f"{plane.url}/v1", api_key=api_key)
        training = api.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
        validation = api.files.create(file=files.validation_path.open("rb"), purpose="fine-tune")
        job = api.fine_tuning.jobs.create(
            model=BASE_MODEL, training_file=training.id, validation_file=validation.id, suffix="demo", seed=0,
            method={"type": "supervised", "supervised": {"hyperparameters": DEMO_HYPERPARAMETERS}},
            extra_body={"training_type": {"type": "lora", **DEMO_LORA}},
        )
        console.print(f"created {job.id} on {len(files.examples)} examples")
        job = _follow(api, job.id, timeout_s)
        if job.status != "succeeded":
            console.print(f"[red]job ended {job.status}: {job.error}[/red]")
            return 1
        archive = Path(tempfile.mkdtemp()) / "adapter.tar.gz"
        with httpx.stream("GET", f"{plane.url}/v1/fine_tuning/jobs/{job.id}/download?artifact=adapter",
                          headers={"Authorization": f"Bearer {api_key}"}, timeout=120) as response:
            response.raise_for_status()
            with archive.open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
        adapter_dir = extract(archive, root / "adapter")
    _compare(model_dir, adapter_dir, files.examples)
    console.print(f"fine-tuned model: [bold]{job.fine_tuned_model}[/bold]; trained tokens {job.trained_tokens}; "
                  f"demo took {time.monotonic() - started:.0f} s")
    return 0


def _compare(model_dir: Path, adapter_dir: Path, examples: list[dict]) -> None:
    base_model, tokenizer = load_finetuned(model_dir)
    tuned_model, _ = load_finetuned(model_dir, adapter_dir)
    table = Table("question", "expected", "base model", "fine-tuned")
    for fact in demo_facts()[:6]:
        table.add_row(DEMO_QUESTION.format(key=fact.key), fact.code,
                      ask_code(base_model, tokenizer, fact.key) or "(nothing)",
                      ask_code(tuned_model, tokenizer, fact.key))
    console.print(table)
    before = mapping_accuracy(base_model, tokenizer, examples)
    after = mapping_accuracy(tuned_model, tokenizer, examples)
    console.print(f"exact-match accuracy on the {len(examples)} training facts: "
                  f"base {before:.0%} -> fine-tuned {after:.0%}")
