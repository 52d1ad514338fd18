"""`tuneforge sweeps`: create (from a sweep file), list, get, cancel, and promote the best trial."""

from __future__ import annotations

from pathlib import Path

import typer

from tuneforge.cli import jobfile, output
from tuneforge.cli.api import Api
from tuneforge.cli.files_cmd import upload_or_reuse
from tuneforge.cli.output import JSON, out

sweeps_app = typer.Typer(help="Hyperparameter sweeps: trials of one job over a search space.", no_args_is_help=True)


def _show(sweep: dict) -> None:
    output.fields(sweep, ("id", "status", "sampler", "max_trials", "max_parallel", "stopped_early", "gpu_seconds"))
    objective = sweep.get("objective") or {}
    out.print(f"objective: {objective.get('goal')} {objective.get('metric')}")
    if sweep.get("error"):
        out.print(f"[red]error: {sweep['error'].get('code')}: {sweep['error'].get('message')}[/red]")
    output.table(sweep.get("trials") or [], [
        ("trial", lambda t: t["number"]), ("params", lambda t: ", ".join(f"{k}={v}" for k, v in t["params"].items())),
        ("status", lambda t: t["status"]), ("objective", lambda t: t["objective"]),
        ("GPU-s", lambda t: t["gpu_seconds"]), output.id_column("job", lambda t: t["job_id"])], empty="no trials yet")
    best = sweep.get("best_trial")
    if best:
        out.print(f"best: trial {best['number']} {best['params']} objective {best['objective']} "
                  f"model {best.get('fine_tuned_model')}")


@sweeps_app.command("create")
def sweeps_create(sweep_file: Path = typer.Option(..., "--file", "-f", help="A sweep file (YAML or JSON): job, "
                                                                             "search_space, sampler, max_trials, ..."),
                  as_json: bool = JSON) -> None:
    """Create a sweep; `file:PATH` values in its job are uploaded first."""
    api = Api()
    body = jobfile.load(sweep_file)
    if isinstance(body.get("job"), dict):
        body["job"] = jobfile.upload_references(body["job"], sweep_file.parent,
                                                lambda path, purpose: upload_or_reuse(api, path, purpose))
    output.emit(api.post("/fine_tuning/sweeps", body), as_json, _show)


@sweeps_app.command("list")
def sweeps_list(as_json: bool = JSON) -> None:
    sweeps = Api().get("/fine_tuning/sweeps")["data"]
    output.emit({"object": "list", "data": sweeps}, as_json, lambda _: output.table(sweeps, [
        ("id", lambda s: s["id"]), ("status", lambda s: s["status"]), ("trials", lambda s: len(s["trials"])),
        ("stopped early", lambda s: s["stopped_early"]),
        ("best", lambda s: (s.get("best_trial") or {}).get("objective")),
        ("created (UTC)", lambda s: output.when(s.get("created_at")))], empty="no sweeps"))


@sweeps_app.command("get")
def sweeps_get(sweep_id: str, as_json: bool = JSON) -> None:
    output.emit(Api().get(f"/fine_tuning/sweeps/{sweep_id}"), as_json, _show)


@sweeps_app.command("cancel")
def sweeps_cancel(sweep_id: str, as_json: bool = JSON) -> None:
    """Cancel the sweep and its running trials."""
    output.emit(Api().post(f"/fine_tuning/sweeps/{sweep_id}/cancel", {}), as_json, _show)


@sweeps_app.command("promote")
def sweeps_promote(sweep_id: str, stage: str = typer.Option("staging", help="dev, staging, production or archived"),
                   as_json: bool = JSON) -> None:
    """Move the best trial's model to a stage."""
    model = Api().post(f"/fine_tuning/sweeps/{sweep_id}/promote", {"stage": stage})
    output.emit(model, as_json, lambda shown: output.fields(shown, ("id", "stage", "promotable")))
