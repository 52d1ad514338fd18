"""`tuneforge`: the command line.

Tenant commands speak to a server over its API (cli/api.py says where and with which key):
files, jobs, models, events, checkpoints, webhooks, usage, secrets. Operator commands act on the
platform's own database and store where it runs (tenants, base-models, eval-sets, migrate, queue,
secrets new-key/rotate) or on its admin API (keys). `up`, `serve` and `demo` run the platform.

Failures print one line and exit with a code (cli/api.py): never a traceback for a server that
cannot be reached or a request it refused.
"""

from __future__ import annotations

from typing import Any

import typer

from tuneforge import __version__
from tuneforge.cli import admin, files_cmd, jobs_cmd, queue_cmd, resources_cmd, secrets_cmd, sweeps_cmd
from tuneforge.cli.output import JSON

# plain click output: an error is one line on stderr (CliFailure.show), help is plain text
app = typer.Typer(help="tuneforge: self-hosted, OpenAI-compatible fine-tuning.", no_args_is_help=True,
                  rich_markup_mode=None, pretty_exceptions_enable=False)


def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"tuneforge {__version__}")
        raise typer.Exit()


@app.callback()
def _process(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    from tuneforge.security.env import restrict_umask

    # whatever a command writes (database, logs, object store, caches) is this user's only
    restrict_umask()


# tenants' resources, over the API
app.add_typer(files_cmd.files_app, name="files")
app.add_typer(jobs_cmd.jobs_app, name="jobs")
app.add_typer(sweeps_cmd.sweeps_app, name="sweeps")
app.add_typer(resources_cmd.models_app, name="models")
app.add_typer(resources_cmd.webhooks_app, name="webhooks")
app.command("usage")(resources_cmd.usage)


@app.command("events")
def events(job_id: str, limit: int = typer.Option(50, min=1), as_json: bool = JSON) -> None:
    """A job's events, newest first (as `jobs events`)."""
    jobs_cmd.jobs_events(job_id, limit, as_json)


@app.command("checkpoints")
def checkpoints(job_id: str, as_json: bool = JSON) -> None:
    """A job's checkpoints (as `jobs checkpoints`)."""
    jobs_cmd.jobs_checkpoints(job_id, as_json)


# secrets: the tenant's own (over the API) and the operator's sealing key (local)
secrets_cmd.secrets_app.command("set")(resources_cmd.secrets_set)
secrets_cmd.secrets_app.command("list")(resources_cmd.secrets_list)
secrets_cmd.secrets_app.command("delete")(resources_cmd.secrets_delete)
app.add_typer(secrets_cmd.secrets_app, name="secrets")
app.add_typer(resources_cmd.keys_app, name="keys")

# the operator's, on the platform's own database and store
app.add_typer(admin.tenants_app, name="tenants")
app.add_typer(admin.base_models_app, name="base-models")
app.add_typer(admin.eval_sets_app, name="eval-sets")
app.command("migrate")(admin.migrate)
app.command("init")(admin.init)
app.command("queue")(queue_cmd.show_queue)
app.command("audit")(admin.audit)


WORKERS_HELP = "API worker processes (default TUNEFORGE_API_WORKERS, else the CPU count)."


def _serve(host: str | None, port: int | None, scheduler: bool, workers: int | None) -> None:
    from tuneforge.security.redact import redact_url
    from tuneforge.server import ControlPlane, configure_logging
    from tuneforge.settings import Settings

    overrides = {k: v for k, v in {"host": host, "port": port, "api_workers": workers}.items() if v is not None}
    settings = Settings(**overrides)
    busy = _port_in_use(settings.host, settings.port)
    if busy:
        typer.echo(f"error: cannot listen on {settings.host}:{settings.port}: {busy}. Another tuneforge (or "
                   "another program) is using it: stop it, or pick another port with --port.", err=True)
        raise typer.Exit(code=2)
    configure_logging()
    plane = ControlPlane(settings, run_scheduler=scheduler)
    typer.echo(f"tuneforge listening on {redact_url(plane.url)} with {settings.resolved_api_workers} API "
               f"worker(s) (home {settings.home.resolve()}, database {redact_url(settings.resolved_database_url)}, "
               f"objects {redact_url(settings.resolved_storage_url)}, executor {settings.executor})", err=True)
    typer.echo(f"console: {redact_url(plane.url)}/console (sign in with a tenant's API key: "
               "`tuneforge tenants create NAME` prints one)", err=True)
    plane.serve_forever()


def _port_in_use(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on now (None: it can), checked as the server binds."""
    import socket

    if not port:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        probe.close()
    return None


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
    home: str = typer.Option(None, help="The platform's home to run it on (default: TUNEFORGE_HOME, else the "
                                        "user's data folder: the one `tuneforge up` opens)."),
    port: int = typer.Option(None, help="Port of its control plane (default 8000 where free)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the control plane running afterwards (Ctrl-C stops it)."),
) -> None:
    """Build a tiny model, fine-tune it through the API, show answers before and after; then print the
    console's URL, the API key and the next steps."""
    from tuneforge.demo.run import run_demo

    raise typer.Exit(code=run_demo(home, port=port, keep=keep))


# a package an install without the extra lacks -> the extra that brings it
EXTRA_OF = {"ray": "ray", "psycopg": "postgres", "boto3": "s3", "botocore": "s3", "wandb": "tracking",
            "mlflow": "tracking", "redis": "redis"}


def main(args: list[str] | None = None) -> Any:
    """The console script. A command whose packages this install lacks (the client-only install
    runs an operator command) says which extra to install, in one line, instead of a traceback."""
    try:
        return app(args=args, prog_name="tuneforge")
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing == "tuneforge":
            raise
        extra = EXTRA_OF.get(missing, "server")
        typer.echo(f"error: this command needs tuneforge's [{extra}] extra (the package {missing!r} is not "
                   f"installed): pip install -e '.[{extra}]' in the repository, or the wheel with [{extra}]",
                   err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
