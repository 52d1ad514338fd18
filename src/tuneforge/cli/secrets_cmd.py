"""`tuneforge secrets`: the encryption key of tenant secrets and webhook signing secrets (admin)."""

from __future__ import annotations

import typer

from tuneforge.cli.admin import console, platform
from tuneforge.cli.lazy import Lazy

crypto = Lazy("tuneforge.security.crypto")
secret_service = Lazy("tuneforge.services.tenancy.secrets")

secrets_app = typer.Typer(help="Your secrets (set, list, delete; over the API) and the operator's keys that seal them "
                               "at rest (new-key, rotate).",
                          no_args_is_help=True)


@secrets_app.command("new-key")
def secrets_new_key() -> None:
    """Print a new key; put it first in TUNEFORGE_SECRETS_KEY (NEW,OLD), then run `rotate`."""
    typer.echo(crypto.new_key())


@secrets_app.command("rotate")
def secrets_rotate() -> None:
    """Re-seal every stored secret under the first key of TUNEFORGE_SECRETS_KEY (values stored
    before encryption get sealed too); afterwards older keys can be dropped from the setting."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            count = secret_service.rotate(session, ctx.sealer)
    except crypto.SecretsKeyError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(code=2) from None
    finally:
        ctx.db.dispose()
    console.print(f"re-sealed {count} secret(s) under the newest key")
