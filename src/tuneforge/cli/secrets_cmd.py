"""`tuneforge secrets`: the encryption key of tenant secrets and webhook signing secrets (admin)."""

from __future__ import annotations

import typer

from tuneforge.cli.admin import console, platform
from tuneforge.security.crypto import SecretsKeyError, new_key
from tuneforge.services import secrets as secret_service

secrets_app = typer.Typer(help="Keys that seal tenant secrets and webhook signing secrets at rest (admin).",
                          no_args_is_help=True)


@secrets_app.command("new-key")
def secrets_new_key() -> None:
    """Print a new key; put it first in TUNEFORGE_SECRETS_KEY (NEW,OLD), then run `rotate`."""
    typer.echo(new_key())


@secrets_app.command("rotate")
def secrets_rotate() -> None:
    """Re-seal every stored secret under the first key of TUNEFORGE_SECRETS_KEY (values stored
    before encryption get sealed too); afterwards older keys can be dropped from the setting."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            count = secret_service.rotate(session, ctx.sealer)
    except SecretsKeyError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=2) from None
    finally:
        ctx.db.dispose()
    console.print(f"re-sealed {count} secret(s) under the newest key")
