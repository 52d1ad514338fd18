"""`tuneforge models | webhooks | usage | secrets (tenant) | keys`: the other resources of the API."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from tuneforge.cli import output
from tuneforge.cli.api import EXIT_USAGE, Api, CliFailure
from tuneforge.cli.files_cmd import download
from tuneforge.cli.output import JSON, err, out

models_app = typer.Typer(help="Models: base models and your fine-tuned ones, their stages and lineage.",
                         no_args_is_help=True)
webhooks_app = typer.Typer(help="Webhook endpoints that receive job events.", no_args_is_help=True)
keys_app = typer.Typer(help="A tenant's API keys, through the admin API (TUNEFORGE_ADMIN_API_KEY).",
                       no_args_is_help=True)


# -- models ----------------------------------------------------------------------------------------

def _show_model(model: dict) -> None:
    output.fields(model, ("id", "type", "base_model", "job_id", "artifact", "stage", "promotable", "deprecated",
                          "sha256"))
    for reason in model.get("gate_failures") or []:
        out.print(f"gate failed: {reason}")
    for suggestion in model.get("suggestions") or []:
        out.print(f"suggestion: {suggestion}")
    lineage = model.get("lineage") or {}
    if lineage.get("training_run"):
        out.print(f"trained through the training API: {lineage.get('checkpoint')}")
    parent = lineage.get("parent")
    if parent:
        out.print(f"continues: {parent.get('model')}")


@models_app.command("list")
def models_list(include_deprecated: bool = typer.Option(False, "--include-deprecated"), as_json: bool = JSON) -> None:
    shown = Api().get("/models", include_deprecated="true" if include_deprecated else None)
    items = shown.get("data", [])
    output.emit(shown, as_json, lambda _: output.table(items, [
        ("id", lambda m: m["id"]), ("type", lambda m: m.get("type")), ("stage", lambda m: m.get("stage")),
        output.id_column("base", lambda m: m.get("base_model")),
        ("created (UTC)", lambda m: output.when(m.get("created")))],
        empty="no models"))


@models_app.command("get")
def models_get(model_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().get(f"/models/{model_id}"), as_json, _show_model)


@models_app.command("delete")
def models_delete(model_id: str, as_json: bool = JSON) -> None:
    """Delete a fine-tuned model (its files are kept for the operator's grace period; `restore` undoes it)."""
    output.emit(Api().delete(f"/models/{model_id}"), as_json, lambda d: out.print(f"deleted {d.get('id', model_id)}"))


@models_app.command("restore")
def models_restore(model_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().post(f"/models/{model_id}/restore"), as_json, _show_model)


@models_app.command("promote")
def models_promote(model_id: str, stage: str = typer.Argument(..., help="dev, staging, production or archived"),
                   as_json: bool = JSON) -> None:
    """Move a model to a stage (staging and production need its eval gates passed)."""
    output.emit(Api().post(f"/models/{model_id}/promote", {"stage": stage}), as_json, _show_model)


@models_app.command("register")
def models_register(source: str = typer.Argument(..., help="A training-API checkpoint: "
                                                  "tinker://<model id>/weights/<name> or .../sampler_weights/<name>"),
                    suffix: str = typer.Option(None, help="Put in the model's name"), as_json: bool = JSON) -> None:
    """Register a training-API checkpoint as a fine-tuned model (chat with it, continue it by a job,
    download and promote it)."""
    output.emit(Api().post("/models", {"source": source, **({"suffix": suffix} if suffix else {})}), as_json,
                _show_model)


@models_app.command("download")
def models_download(model_id: str, output_path: Path = typer.Option(None, "--output", "-o")) -> None:
    """A fine-tuned model's weights as a .tar.gz (an adapter in PEFT's format), with a progress bar."""
    target = output_path or Path(f"{model_id.replace(':', '_')}.tar.gz")
    written = download(Api(), f"/models/{model_id}/download", None, target)
    err.print(f"wrote {target} ({written} bytes)")


@models_app.command("stages")
def models_stages(model_id: str, as_json: bool = JSON) -> None:
    """The model's stage history."""
    shown = Api().get(f"/models/{model_id}/stages")
    items = shown.get("data", [])
    output.emit(shown, as_json, lambda _: output.table(items, [
        ("time (UTC)", lambda s: output.when(s.get("created_at"))), ("from", lambda s: s.get("from_stage")),
        ("to", lambda s: s.get("to_stage")), ("by", lambda s: s.get("actor")), ("reason", lambda s: s.get("reason"))],
        empty="no stage changes"))


# -- webhooks --------------------------------------------------------------------------------------

def _show_webhook(hook: dict) -> None:
    output.fields(hook, ("id", "url", "events"))
    if hook.get("secret"):
        out.print(f"secret: {hook['secret']}  (shown once: keep it to verify signatures)")


@webhooks_app.command("create")
def webhooks_create(url: str, event: list[str] = typer.Option([], "--event", help="An event type, repeatable; "
                                                                                  "default all"),
                    as_json: bool = JSON) -> None:
    output.emit(Api().post("/webhooks", {"url": url, **({"events": event} if event else {})}), as_json,
                _show_webhook)


@webhooks_app.command("list")
def webhooks_list(as_json: bool = JSON) -> None:
    items = list(Api().pages("/webhooks"))
    output.emit({"object": "list", "data": items}, as_json, lambda _: output.table(items, [
        ("id", lambda h: h["id"]), ("url", lambda h: h.get("url")),
        ("events", lambda h: ", ".join(h.get("events") or []))],
        empty="no webhooks"))


@webhooks_app.command("get")
def webhooks_get(webhook_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().get(f"/webhooks/{webhook_id}"), as_json, _show_webhook)


@webhooks_app.command("update")
def webhooks_update(webhook_id: str, url: str = typer.Option(None),
                    event: list[str] = typer.Option([], "--event"), as_json: bool = JSON) -> None:
    body = {k: v for k, v in {"url": url, "events": event or None}.items() if v is not None}
    if not body:
        raise CliFailure("give --url or --event", EXIT_USAGE)
    output.emit(Api().post(f"/webhooks/{webhook_id}", body), as_json, _show_webhook)


@webhooks_app.command("delete")
def webhooks_delete(webhook_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().delete(f"/webhooks/{webhook_id}"), as_json, lambda _: out.print(f"deleted {webhook_id}"))


@webhooks_app.command("deliveries")
def webhooks_deliveries(webhook_id: str, limit: int = typer.Option(20, min=1), as_json: bool = JSON) -> None:
    items = list(Api().pages(f"/webhooks/{webhook_id}/deliveries", most=limit, page_size=min(limit, 100)))
    output.emit({"object": "list", "data": items}, as_json, lambda _: output.table(items, [
        ("time (UTC)", lambda d: output.when(d.get("created_at"))), ("event", lambda d: d.get("event_type")),
        ("status", lambda d: d.get("status")), ("attempts", lambda d: d.get("attempts")),
        ("last result", lambda d: d.get("last_error") or d.get("last_status_code"))], empty="no deliveries"))


# -- usage -----------------------------------------------------------------------------------------

def usage(month: str = typer.Option(None, help="YYYY-MM (UTC); default this month"), as_json: bool = JSON) -> None:
    """Your GPU-hours in a month, per job, against your allowance."""
    shown = Api().get("/usage", month=month)

    def human(_: dict) -> None:
        output.table(shown.get("data", []), [
            output.id_column("job", lambda u: u.get("job_id")), output.id_column("model", lambda u: u.get("model")),
            ("status", lambda u: u.get("status")),
            ("GPU-s", lambda u: u.get("gpu_seconds")), ("billable GPU-s", lambda u: u.get("billable_gpu_seconds")),
            ("refunded GPU-s", lambda u: u.get("refunded_gpu_seconds"))], empty="no jobs this month")
        output.fields(shown.get("totals") or {}, tuple((shown.get("totals") or {}).keys()))

    output.emit(shown, as_json, human)


# -- tenant secrets --------------------------------------------------------------------------------

def secrets_set(name: str, value: str = typer.Option(None, help="The value (default: read from stdin, so that "
                                                                "it stays out of the shell's history)"),
                as_json: bool = JSON) -> None:
    """Store one of your secrets (e.g. WANDB_API_KEY, a judge's key) for your jobs to use."""
    if value is None:
        value = typer.get_text_stream("stdin").read().rstrip("\n")
    output.emit(Api().post("/secrets", {"name": name, "value": value}), as_json,
                lambda s: out.print(f"stored {s.get('name', name)}"))


def secrets_list(as_json: bool = JSON) -> None:
    """Your secrets' names and dates (values are never shown)."""
    shown = Api().get("/secrets")
    items = shown.get("data", [])
    output.emit(shown, as_json, lambda _: output.table(items, [
        ("name", lambda s: s.get("name")), ("updated (UTC)", lambda s: output.when(s.get("updated_at")))],
        empty="no secrets"))


def secrets_delete(name: str, as_json: bool = JSON) -> None:
    output.emit(Api().delete(f"/secrets/{name}"), as_json, lambda _: out.print(f"deleted {name}"))


# -- API keys (admin) ------------------------------------------------------------------------------

def _admin() -> Api:
    key = os.environ.get("TUNEFORGE_ADMIN_API_KEY")
    if not key:
        raise CliFailure("set TUNEFORGE_ADMIN_API_KEY to the operator's admin key", EXIT_USAGE)
    return Api(key=key)


@keys_app.command("create")
def keys_create(tenant: str, name: str = typer.Option(None), expires_in_s: int = typer.Option(None, min=1),
                as_json: bool = JSON) -> None:
    """Issue another API key of a tenant (the key is printed once)."""
    body = {k: v for k, v in {"name": name, "expires_in_s": expires_in_s}.items() if v is not None}
    output.emit(_admin().post(f"/admin/tenants/{tenant}/keys", body or None), as_json,
                lambda k: out.print(f"{k.get('id')}  {k.get('api_key')}"))


@keys_app.command("list")
def keys_list(tenant: str, as_json: bool = JSON) -> None:
    shown = _admin().get(f"/admin/tenants/{tenant}/keys")
    items = shown.get("data", [])
    output.emit(shown, as_json, lambda _: output.table(items, [
        ("id", lambda k: k.get("id")), ("name", lambda k: k.get("name")), ("prefix", lambda k: k.get("prefix")),
        ("revoked", lambda k: output.when(k.get("revoked_at"))),
        ("expires", lambda k: output.when(k.get("expires_at")))],
        empty="no keys"))


@keys_app.command("revoke")
def keys_revoke(tenant: str, key_id: str, as_json: bool = JSON) -> None:
    output.emit(_admin().delete(f"/admin/tenants/{tenant}/keys/{key_id}"), as_json,
                lambda _: out.print(f"revoked {key_id}"))
