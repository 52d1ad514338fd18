"""The vLLM hand-off against a real vLLM server (a GPU host): an adapter promoted to production is
loaded into vLLM through its runtime LoRA API and answers through tuneforge exactly as vLLM itself
answers for it; deleting the model unloads it. Prints each step's time.

Start vLLM first, on the same host, with the base model under the name tuneforge gives it, and the
shared adapter directory readable at the same path:

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen2.5-0.5B-Instruct \\
        --served-model-name qwen2.5-0.5b-instruct --enable-lora --max-lora-rank 16 --port 8001

    python benchmarks/vllm_handoff.py --vllm-url http://127.0.0.1:8001 \\
        --base-name qwen2.5-0.5b-instruct --base-source Qwen/Qwen2.5-0.5B-Instruct

`--base-source` is a local model directory or a hub id (downloaded into a temporary home). The
adapter is a random LoRA (rank 8 on q_proj and v_proj), so its answers differ from the base's.
Exits 1 when a check fails. Without a server at --vllm-url it says so and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--base-name", required=True, help="vLLM's --served-model-name; the tuneforge base name")
    parser.add_argument("--base-source", required=True, help="the same weights: a local directory or hub id")
    parser.add_argument("--api-key", default=None, help="vLLM's --api-key, if it has one")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        httpx.get(args.vllm_url + "/v1/models", headers=headers, timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        print(f"vllm_handoff: no vLLM server answers at {args.vllm_url} ({exc})")
        return 2

    from fastapi.testclient import TestClient

    from tuneforge.api.app import create_app
    from tuneforge.db.migrate import upgrade
    from tuneforge.db.tables import FineTunedModel, Job
    from tuneforge.domain.job_config import JobRequest
    from tuneforge.services.context import Platform
    from tuneforge.services.serving import base_models as base_model_service
    from tuneforge.services.tenancy import tenants as tenant_service
    from tuneforge.settings import Settings
    from tuneforge.storage import layout

    home = Path(tempfile.mkdtemp(prefix="tuneforge-vllm-"))
    settings = Settings(home=home, vllm_urls={args.base_name: [args.vllm_url]}, vllm_api_key=args.api_key,
                        vllm_adapter_dir=home / "vllm-adapters")
    upgrade(settings.resolved_database_url)
    platform = Platform.from_settings(settings)
    now = int(time.time())
    with platform.db.session() as session:
        base = base_model_service.add_base_model(session, platform.store, args.base_name, args.base_source,
                                                 home / "hub")
        tenant, key = tenant_service.create_tenant(session, "gpu-check")
        job_id = "ftjob-vllm-check"
        session.add(Job(job_id=job_id, tenant_id=tenant.tenant_id, model=args.base_name,
                        base_model_sha256=base.sha256, training_file="file-none", status="succeeded", seed=0,
                        request=JobRequest(model=args.base_name, training_file="file-none"), request_hash="0" * 64,
                        created_at=now))
        session.flush()
        prefix = layout.artifact_prefix(tenant.tenant_id, job_id, "adapter")
        platform.store.upload_dir(_random_lora(args.base_source, home / "adapter"), prefix)
        model_id = f"ft:{args.base_name}:gpu-check::check1"
        session.add(FineTunedModel(model_id=model_id, tenant_id=tenant.tenant_id, job_id=job_id,
                                   base_model=args.base_name, base_model_sha256=base.sha256, artifact_prefix=prefix,
                                   created_at=now, artifact_kind="adapter"))
    http = TestClient(create_app(platform=platform))
    auth = {"Authorization": f"Bearer {key}"}
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok     " if ok else "FAILED ") + what)
        if not ok:
            failures.append(what)

    started = time.perf_counter()
    for stage in ("staging", "production"):
        http.post(f"/v1/models/{model_id}/promote", headers=auth, json={"stage": stage}).raise_for_status()
    print(f"promotion (copy + load into vLLM): {time.perf_counter() - started:.2f} s")
    listed = httpx.get(args.vllm_url + "/v1/models", headers=headers, timeout=30).json()["data"]
    check(any(entry["id"] == model_id for entry in listed), "vLLM lists the promoted adapter")

    request = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
               "temperature": 0}
    started = time.perf_counter()
    through = http.post("/v1/chat/completions", headers=auth, json={"model": model_id, **request}).json()
    print(f"chat through tuneforge: {time.perf_counter() - started:.2f} s")
    direct = httpx.post(args.vllm_url + "/v1/chat/completions", headers=headers, timeout=120,
                        json={"model": model_id, **request}).json()
    base_answer = httpx.post(args.vllm_url + "/v1/chat/completions", headers=headers, timeout=120,
                             json={"model": args.base_name, **request}).json()
    text = through["choices"][0]["message"]["content"]
    check(through["model"] == model_id, "the answer names the tenant's model")
    check(text == direct["choices"][0]["message"]["content"], "tuneforge's answer is vLLM's answer for the adapter")
    check(text != base_answer["choices"][0]["message"]["content"], "the adapter changes the answer (not the base)")
    with http.stream("POST", "/v1/chat/completions", headers=auth,
                     json={"model": model_id, "stream": True, **request}) as response:
        streamed = [line for line in response.iter_lines() if line]
    check(streamed[-1] == "data: [DONE]", "a streamed answer ends with [DONE]")

    http.delete(f"/v1/models/{model_id}", headers=auth).raise_for_status()
    listed = httpx.get(args.vllm_url + "/v1/models", headers=headers, timeout=30).json()["data"]
    check(all(entry["id"] != model_id for entry in listed), "deleting the model unloads it from vLLM")
    print("vllm_handoff:", "all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def _random_lora(base_source: str, out_dir: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_source, dtype=torch.float32)
    torch.manual_seed(0)
    adapter = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                               init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    sys.exit(main())
