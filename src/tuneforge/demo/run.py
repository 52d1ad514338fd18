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


DEMO_PORT = 8000


def _port(asked: int | None) -> int:
    """The port asked for, else 8000 where it is free (the port `tuneforge up` uses in the README),
    else any free one."""
    if asked:
        return asked
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", DEMO_PORT))
            return DEMO_PORT
        except OSError:
            return _free_port()


def _tenant_key(session, name: str) -> str:  # noqa: ANN001 - a SQLAlchemy session
    """The demo tenant's API key: a new tenant, or a new key of the one an earlier demo made."""
    if all(tenant.name != name for tenant in tenant_service.list_tenants(session)):
        return tenant_service.create_tenant(session, name)[1]
    return tenant_service.create_key(session, name, name="demo")[1]


def _base_model(session, plane: ControlPlane, root: Path) -> Path:  # noqa: ANN001
    """The tiny base model's folder, registered once per home (an earlier demo's is reused: its
    weights are rebuilt bit for bit from the same seed, which its digest checks)."""
    model_dir = root / "models" / BASE_MODEL
    if not (model_dir / "config.json").is_file():
        shutil.rmtree(model_dir, ignore_errors=True)
        build_tiny_model(model_dir)
    row = base_model_service.find(session, BASE_MODEL)
    if row is None:
        base_model_service.add_base_model(session, plane.platform.store, BASE_MODEL, str(model_dir),
                                          layout.hub_cache_dir(layout.local_cache_dir(plane.settings.home)))
    elif row.sha256 != base_model_service.model_sha256(model_dir):
        raise RuntimeError(f"this home has a base model named {BASE_MODEL!r} that is not the demo's "
                           f"(sha256 {row.sha256[:12]}...): run the demo with another --home")
    return model_dir


def run_demo(home: str | None = None, *, port: int | None = None, keep: bool = False, timeout_s: float = 600.0,
             hyperparameters: dict | None = None) -> int:
    """The demo on the platform's home (`home`, else TUNEFORGE_HOME or the user's data folder), where
    `tuneforge up` finds its tenant, job and model afterwards; `keep`: go on serving until Ctrl-C."""
    started = time.monotonic()
    _quiet_libraries()
    base_settings = Settings()
    root = Path(home) if home else base_settings.home
    settings = base_settings.model_copy(update={"home": root, "port": _port(port)})
    work = root / "demo"  # the demo's own files: the tiny model, the data, the downloaded adapter
    console.rule("tuneforge demo")
    files = write_demo_files(work / "data")
    with ControlPlane(settings) as plane:
        with plane.platform.db.session() as session:
            api_key = _tenant_key(session, "demo")
            model_dir = _base_model(session, plane, work)
        console.print(f"control plane on {plane.url} (home {root.resolve()}); tenant 'demo'; base model "
                      f"'{BASE_MODEL}' ({sum(1 for _ in model_dir.iterdir())} files)")
        api = openai.OpenAI(base_url=f"{plane.url}/v1", api_key=api_key)
        training = api.files.create(file=files.training_path.open("rb"), purpose="fine-tune")
        validation = api.files.create(file=files.validation_path.open("rb"), purpose="fine-tune")
        job = api.fine_tuning.jobs.create(
            model=BASE_MODEL, training_file=training.id, validation_file=validation.id, suffix="demo", seed=0,
            method={"type": "supervised", "supervised": {"hyperparameters": hyperparameters or DEMO_HYPERPARAMETERS}},
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
        adapter_dir = extract(archive, work / "adapter")
        _compare(model_dir, adapter_dir, files.examples)
        console.print(f"fine-tuned model: [bold]{job.fine_tuned_model}[/bold]; trained tokens {job.trained_tokens}; "
                      f"demo took {time.monotonic() - started:.0f} s")
        _next_steps(plane.url, api_key, job, root, keep)
        if keep:
            try:
                while True:
                    time.sleep(1.0)
            except KeyboardInterrupt:
                console.print("stopped")
    return 0


def _next_steps(url: str, api_key: str, job: openai.types.fine_tuning.FineTuningJob, root: Path, keep: bool) -> None:
    """Where the demo leaves you: the console with its job, the key, and commands to paste."""
    console.rule("next")
    port = url.rsplit(":", 1)[-1]
    serving = (f"The control plane keeps running at {url} until Ctrl-C." if keep else
               f"The demo's platform stays in {root.resolve()}: `tuneforge up --port {port}` serves it again"
               + ("" if root.resolve() == Settings().home.resolve() else f" (with TUNEFORGE_HOME={root.resolve()})")
               + ", or run the demo with --keep.")
    lines = [
        serving,
        f"console:  {url}/console   (sign in with the API key; the job {job.id}, its charts and the model are there)",
        f"API key:  {api_key}",
        "",
        "CLI:",
        f"  export TUNEFORGE_BASE_URL={url}/v1 TUNEFORGE_API_KEY={api_key}",
        f"  tuneforge jobs get {job.id}",
        "  tuneforge models list",
        "Python (openai SDK):",
        f"  from openai import OpenAI; client = OpenAI(base_url=\"{url}/v1\", api_key=\"{api_key}\")",
        f"  client.chat.completions.create(model=\"{job.fine_tuned_model}\", "
        f"messages=[{{\"role\": \"user\", \"content\": \"{DEMO_QUESTION.format(key=demo_facts()[0].key)}\"}}])",
        "curl:",
        f"  curl -H \"Authorization: Bearer {api_key}\" {url}/v1/fine_tuning/jobs/{job.id}/events",
    ]
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


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
