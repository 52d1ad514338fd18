"""`tuneforge` entry point."""

from __future__ import annotations

import typer

from tuneforge.cli import admin, client, queue_cmd, secrets_cmd
from tuneforge.security.env import restrict_umask
from tuneforge.security.redact import redact_url

app = typer.Typer(help="tuneforge: self-hosted, OpenAI-compatible fine-tuning.", no_args_is_help=True)


@app.callback()
def _process() -> None:
    # whatever a command writes (database, logs, object store, caches) is this user's only
    restrict_umask()


app.add_typer(admin.tenants_app, name="tenants")
app.add_typer(admin.base_models_app, name="base-models")
app.add_typer(admin.eval_sets_app, name="eval-sets")
app.add_typer(secrets_cmd.secrets_app, name="secrets")
app.add_typer(client.files_app, name="files")
app.add_typer(client.jobs_app, name="jobs")
app.command("migrate")(admin.migrate)
app.command("queue")(queue_cmd.show_queue)
app.command("usage")(admin.usage)


WORKERS_HELP = "API worker processes (default TUNEFORGE_API_WORKERS, else the CPU count)."


def _serve(host: str | None, port: int | None, scheduler: bool, workers: int | None) -> None:
    from tuneforge.server import ControlPlane, configure_logging
    from tuneforge.settings import Settings

    overrides = {k: v for k, v in {"host": host, "port": port, "api_workers": workers}.items() if v is not None}
    settings = Settings(**overrides)
    configure_logging()
    plane = ControlPlane(settings, run_scheduler=scheduler)
    typer.echo(f"tuneforge listening on {redact_url(plane.url)} with {settings.resolved_api_workers} API "
               f"worker(s) (database {redact_url(settings.resolved_database_url)}, "
               f"objects {redact_url(settings.resolved_storage_url)}, executor {settings.executor})", err=True)
    plane.serve_forever()


@app.command()
def up(host: str = typer.Option(None), port: int = typer.Option(None),
       workers: int = typer.Option(None, min=1, help=WORKERS_HELP)) -> None:
    """API + scheduler + local executor on embedded defaults."""
    _serve(host, port, scheduler=True, workers=workers)


@app.command()
def serve(
    host: str = typer.Option(None),
    port: int = typer.Option(None),
    scheduler: bool = typer.Option(True, help="Run the scheduler loop in this process."),
    workers: int = typer.Option(None, min=1, help=WORKERS_HELP),
) -> None:
    """The control plane as configured by TUNEFORGE_* settings."""
    _serve(host, port, scheduler=scheduler, workers=workers)


@app.command()
def demo(
    home: str = typer.Option(None, help="Folder for the demo's data (default: TUNEFORGE_HOME/demo)."),
) -> None:
    """Build a tiny model, fine-tune it through the API, show answers before and after."""
    from tuneforge.demo.run import run_demo

    raise typer.Exit(code=run_demo(home))


if __name__ == "__main__":
    app()
