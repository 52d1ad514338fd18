"""Admin commands that act on the metadata store directly: tenants (tiers, quotas, usage), base models,
migrate."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tuneforge.cli import output
from tuneforge.cli.lazy import Lazy
from tuneforge.domain.errors import ApiError
from tuneforge.security.redact import redact_url
from tuneforge.settings import get_settings

# the platform's own modules load when an operator command runs: tenant commands stay light
base_model_repo = Lazy("tuneforge.db.repos.base_models")
tenant_repo = Lazy("tuneforge.db.repos.tenants")
base_model_service = Lazy("tuneforge.services.serving.base_models")
quotas = Lazy("tuneforge.services.tenancy.quotas")
tenant_service = Lazy("tuneforge.services.tenancy.tenants")
usage_service = Lazy("tuneforge.services.tenancy.usage")
audit_service = Lazy("tuneforge.services.tenancy.audit")
deletion_service = Lazy("tuneforge.services.tenancy.deletion")
layout = Lazy("tuneforge.storage.layout")

# soft_wrap: a message is one line however narrow the terminal, so scripts can grep it
console = Console(stderr=True, soft_wrap=True)
tenants_app = typer.Typer(help="Create and manage tenants (admin).", no_args_is_help=True)
keys_app = typer.Typer(help="Issue, list and revoke a tenant's API keys (admin).", no_args_is_help=True)
tenants_app.add_typer(keys_app, name="keys")
base_models_app = typer.Typer(help="Register base models (admin).", no_args_is_help=True)
eval_sets_app = typer.Typer(help="Platform-wide eval sets that training data is checked against (admin).",
                            no_args_is_help=True)


NO_DATABASE = ("no tuneforge database at {path} (home {home}). The server prints the home it uses when it "
               "starts: set TUNEFORGE_HOME to that folder, or run `tuneforge init` to create a new platform here.")


def where(settings: Any) -> None:
    """Say which home and database an operator command acts on (stderr: stdout stays the result)."""
    console.print(f"home: {settings.home.resolve()} · database: {redact_url(settings.resolved_database_url)}",
                  highlight=False)


def sqlite_file(settings: Any) -> Path | None:
    """The database file of a SQLite URL (None for another database)."""
    url = settings.resolved_database_url
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def platform(*, create: bool = False):  # noqa: ANN201 - a services.context.Platform
    """The platform an operator command acts on: the home's database, which must exist unless
    `create` (`tuneforge init`, `migrate`); a missing one is never made silently."""
    from tuneforge.db.migrate import upgrade
    from tuneforge.services.context import Platform

    settings = get_settings()
    where(settings)
    found = sqlite_file(settings)
    if found is not None and not found.exists() and not create:
        console.print(f"[red]error:[/red] {NO_DATABASE.format(path=found, home=settings.home.resolve())}",
                      highlight=False)
        raise typer.Exit(code=2)
    upgrade(settings.resolved_database_url)
    return Platform.from_settings(settings)


def fail(exc: ApiError) -> None:
    console.print(f"[red]error:[/red] {exc.message}")
    raise typer.Exit(code=2)


def migrate() -> None:
    """Create or upgrade the metadata store's schema."""
    from tuneforge.db.migrate import upgrade

    settings = get_settings()
    where(settings)
    upgrade(settings.resolved_database_url)
    console.print(f"database at head: {redact_url(settings.resolved_database_url)}")


def init() -> None:
    """Create the platform's home and database (TUNEFORGE_HOME, else the user's data folder); an
    existing one is upgraded, never emptied. `tuneforge up` does this itself."""
    settings = get_settings()
    existed = (found := sqlite_file(settings)) is None or found.exists()
    platform(create=True).db.dispose()
    console.print(f"{'upgraded' if existed else 'created'}: the operator commands and `tuneforge up` use this home "
                  "from any folder", highlight=False)


@tenants_app.command("create")
def tenants_create(
    name: str,
    tier: str = typer.Option("standard", help="free, standard or premium"),
) -> None:
    """Create a tenant; its new API key is printed alone on the last line."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            tenant, api_key = tenant_service.create_tenant(session, name, tier)
            tenant_id = tenant.tenant_id
            audit_service.operator_command(session, "create_tenant", "tenants", tenant_id, name)
    except ApiError as exc:
        fail(exc)
    console.print(f"created tenant {name} ({tenant_id}, tier {tier}); the API key is shown once:")
    typer.echo(api_key)


@tenants_app.command("list")
def tenants_list() -> None:
    ctx = platform()
    with ctx.db.session() as session:
        rows = [{"tenant_id": t.tenant_id, "name": t.name, "tier": t.tier} for t in tenant_repo.list_all(session)]
    output.table(rows, [output.id_column("tenant_id", lambda t: t["tenant_id"]), ("name", lambda t: t["name"]),
                        ("tier", lambda t: t["tier"])], empty="no tenants")


@tenants_app.command("delete")
def tenants_delete(
    name: str,
    yes: bool = typer.Option(False, "--yes", help="Delete without asking (required when not on a terminal)."),
    as_json: bool = output.JSON,
) -> None:
    """Export tenant NAME's data to the object store, cancel its jobs, revoke its keys, then delete its
    objects and every row but billing and the audit log. Asking again is harmless."""
    if not yes and not typer.confirm(f"Delete tenant {name} and all its data (an export is kept)?", err=True):
        raise typer.Exit(code=1)
    ctx = platform()
    try:
        with ctx.db.session() as session:
            deletion = deletion_service.delete_tenant(session, ctx.store, name)
            audit_service.operator_command(session, "delete_tenant", "tenants", name, name,
                                           {"status": deletion.status})
    except ApiError as exc:
        fail(exc)
    view = deletion.view()
    if as_json:
        output.print_json(view)
        return
    console.print(f"tenant {name} ({view['id']}): {view['status']}; export at {view['export_key']}; "
                  f"{len(view['jobs_cancelled'])} job(s) cancelled, {view['keys_revoked']} key(s) revoked, "
                  f"{view['objects_deleted']} object(s) and {sum(view['rows_deleted'].values())} row(s) deleted",
                  highlight=False)
    if view["status"] == "deleting":
        console.print("a trainer of the tenant is still stopping: the scheduler purges its data once it has",
                      highlight=False)


def audit(
    tenant: str = typer.Option(None, "--tenant", help="A tenant's name or id."),
    resource_id: str = typer.Option(None, "--resource-id", help="Only entries about this resource."),
    action: str = typer.Option(None, "--action", help="Only this action (create_job, job.running, ...)."),
    after: int = typer.Option(None, "--after", help="Entries after this entry number."),
    limit: int = typer.Option(100, "--limit", min=1, max=100),
    as_json: bool = output.JSON,
) -> None:
    """The audit log, oldest first: who changed what, when, under which request id."""
    ctx = platform()
    with ctx.db.session() as session:
        rows, has_more = audit_service.entries(session, tenant_id=tenant_service.tenant_id_of(session, tenant),
                                               resource_id=resource_id, action=action, after=after, limit=limit)
        views = [audit_service.view(row) for row in rows]
    if as_json:
        output.print_json({"object": "list", "has_more": has_more, "data": views})
        return
    output.table(views, [("#", lambda r: r["id"]), ("when", lambda r: output.when(r["created_at"])),
                         ("actor", lambda r: r["key_id"] or r["actor"]), ("tenant", lambda r: r["tenant_id"] or "-"),
                         ("action", lambda r: r["action"]), ("resource", lambda r: r["resource_id"] or "-"),
                         ("status", lambda r: r["status_code"] or "-"), ("request", lambda r: r["request_id"] or "-")],
                 empty="no audit entries")
    if has_more:
        console.print(f"more: --after {views[-1]['id']}", highlight=False)


@tenants_app.command("set-tier")
def tenants_set_tier(name: str, tier: str) -> None:
    ctx = platform()
    try:
        with ctx.db.session() as session:
            tenant_service.set_tier(session, name, tier)
            audit_service.operator_command(session, "set_tier", "tenants", name, name, {"tier": tier})
    except ApiError as exc:
        fail(exc)
    console.print(f"{name}: tier {tier}")


_QUOTA_HELP = "a number, 'unlimited', or 'default' (the tier's)"


def _quota_value(option: str, text: str) -> float | None:
    """A quota as typed: a number, 'unlimited' (no limit) or 'default' (back to the tier's default)."""
    word = text.strip().lower()
    if word == "default":
        return None
    if word in ("unlimited", "none"):
        return float(quotas.UNLIMITED)
    try:
        return float(word)
    except ValueError:
        console.print(f"[red]error:[/red] {option} must be {_QUOTA_HELP}; got {text!r}")
        raise typer.Exit(code=2) from None


def _shown(value: float | None) -> str:
    return "unlimited" if value is None else f"{value:g}"


@tenants_app.command("set-quota")
def tenants_set_quota(
    name: str,
    max_concurrent_jobs: str = typer.Option(None, help=f"Jobs running at once: {_QUOTA_HELP}."),
    max_queued_jobs: str = typer.Option(None, help=f"Jobs queued or validating at once: {_QUOTA_HELP}."),
    gpu_hours_hard: str = typer.Option(None, help=f"Billable GPU-hours per month (UTC) after which new jobs are "
                                                  f"refused: {_QUOTA_HELP}."),
    gpu_hours_soft: str = typer.Option(None, help=f"Monthly GPU-hour allowance; usage past it is flagged, not "
                                                  f"refused: {_QUOTA_HELP}."),
) -> None:
    """Override the tenant's tier quotas; options not given keep their value."""
    given = {"max_concurrent_jobs": max_concurrent_jobs, "max_queued_jobs": max_queued_jobs,
             "gpu_hours_hard": gpu_hours_hard, "gpu_hours_soft": gpu_hours_soft}
    changes = {field: _quota_value("--" + field.replace("_", "-"), text)
               for field, text in given.items() if text is not None}
    ctx = platform()
    try:
        with ctx.db.session() as session:
            limits = quotas.limits(tenant_service.set_quota(session, name, changes))
            audit_service.operator_command(session, "set_quota", "tenants", name, name,
                                           {field: value for field, value in changes.items()})
    except ApiError as exc:
        fail(exc)
    console.print(f"{name}: " + ", ".join(f"{field} {_shown(getattr(limits, field))}"
                                          for field in quotas.QUOTA_FIELDS))


def usage(month: str = typer.Option(None, help="Calendar month YYYY-MM (UTC); default: this month.")) -> None:
    """GPU-hours of every tenant in a month: billable, refunded, against allowance and cap."""
    ctx = platform()
    now = time.time()
    try:
        month = usage_service.parse_month(month) if month else usage_service.current_month(now)
    except ApiError as exc:
        fail(exc)
    # "over": billable hours past the soft allowance (allowed, flagged); "hard": the cap new jobs stop at
    table = Table("tenant", "tier", "GPU-h", "billable", "refunded", "soft", "over", "hard",
                  title=f"GPU-hours {month} (UTC)")
    with ctx.db.session() as session:
        for row in tenant_service.usage_report(session, month, now):
            table.add_row(row["tenant"], row["tier"], f"{row['gpu_hours']:.2f}", f"{row['billable_gpu_hours']:.2f}",
                          f"{row['refunded_gpu_hours']:.2f}", _shown(row["gpu_hours_soft"]),
                          "yes" if row["over_soft_allowance"] else "no", _shown(row["gpu_hours_hard"]))
    Console().print(table)


tenants_app.command("usage")(usage)


@tenants_app.command("set-pii-policy")
def tenants_set_pii_policy(name: str, policy: str = typer.Argument(..., help="warn, redact or reject")) -> None:
    """Default handling of personal data and secrets in this tenant's training data."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            tenant_service.set_pii_policy(session, name, policy)
            audit_service.operator_command(session, "set_pii_policy", "tenants", name, name, {"policy": policy})
    except ApiError as exc:
        fail(exc)
    console.print(f"{name}: PII policy {policy}")


@tenants_app.command("revoke-data-key")
def tenants_revoke_data_key(
    name: str,
    yes: bool = typer.Option(False, "--yes", help="Confirm: nothing the tenant stored can be read afterwards."),
) -> None:
    """Erase tenant NAME's data key: every object it stored under envelope encryption
    (TUNEFORGE_ENCRYPT_TENANT_OBJECTS) becomes unreadable, for good, and it can store nothing more."""
    if not yes:
        console.print("[red]error:[/red] this cannot be undone: every object the tenant stored becomes unreadable; "
                      "run again with --yes")
        raise typer.Exit(code=2)
    ctx = platform()
    from tuneforge.services.tenancy.data_keys import TenantKeyRing

    try:
        with ctx.db.session() as session:
            tenant_id = tenant_service.tenant_named(session, name).tenant_id
    except ApiError as exc:
        fail(exc)
    erased = TenantKeyRing(ctx.db, ctx.sealer).revoke(tenant_id)
    console.print(f"{name}: {erased} data key(s) erased; its stored objects can no longer be opened")


def _when(stamp: int | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(stamp))


@keys_app.command("create")
def keys_create(
    name: str,
    expires_in: int = typer.Option(None, "--expires-in", help="Seconds until the key stops working; "
                                                              "default: it does not expire."),
    label: str = typer.Option(None, "--label", help="A name to tell the key apart in lists."),
) -> None:
    """Issue another API key of tenant NAME; the key is printed alone on the last line, once."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            key, api_key = tenant_service.create_key(session, name, name=label, expires_in_s=expires_in)
            key_id, expires_at = key.key_id, key.expires_at
            audit_service.operator_command(session, "create_key", "keys", key_id, name)
    except ApiError as exc:
        fail(exc)
    until = "does not expire" if expires_at is None else f"expires {_when(expires_at)}"
    console.print(f"key {key_id} of tenant {name} ({until}); the API key is shown once:")
    typer.echo(api_key)


@keys_app.command("list")
def keys_list(name: str) -> None:
    """The tenant's keys (never a secret): id, prefix, label, created, last used, expiry, revoked."""
    ctx = platform()
    table = Table("key_id", "prefix", "label", "created", "last_used", "expires", "revoked", "active")
    try:
        with ctx.db.session() as session:
            for key in tenant_service.list_keys(session, name):
                view = tenant_service.key_view(key)
                table.add_row(view["id"], view["prefix"], view["name"] or "-", _when(view["created_at"]),
                              _when(view["last_used_at"]), _when(view["expires_at"]), _when(view["revoked_at"]),
                              "yes" if view["active"] else "no")
    except ApiError as exc:
        fail(exc)
    Console(width=200).print(table)


@keys_app.command("revoke")
def keys_revoke(name: str, key_id: str) -> None:
    """Revoke key KEY_ID of tenant NAME; requests with it are refused from now on."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            key = tenant_service.revoke_key(session, name, key_id)
            revoked_at = key.revoked_at
            audit_service.operator_command(session, "revoke_key", "keys", key_id, name)
    except ApiError as exc:
        fail(exc)
    console.print(f"{name}: key {key_id} revoked at {_when(revoked_at)}")


@base_models_app.command("add")
def base_models_add(name: str, source: str) -> None:
    """Register SOURCE (a local model folder or a hub id) as base model NAME."""
    ctx = platform()
    try:
        with ctx.db.session() as session:
            row = base_model_service.add_base_model(
                session, ctx.store, name, source, layout.hub_cache_dir(layout.local_cache_dir(ctx.settings.home)))
            sha, size = row.sha256, row.size_bytes
            audit_service.operator_command(session, "add_base_model", "base-models", name, None, {"sha256": sha})
    except ApiError as exc:
        fail(exc)
    console.print(f"registered base model {name}: sha256 {sha}, {size / 1e6:.1f} MB")
    typer.echo(name)


@base_models_app.command("list")
def base_models_list() -> None:
    ctx = platform()
    table = Table("name", "sha256", "size_mb", "source")
    with ctx.db.session() as session:
        for row in base_model_repo.list_all(session):
            table.add_row(row.name, row.sha256[:16], f"{row.size_bytes / 1e6:.1f}", row.source)
    Console().print(table)


@eval_sets_app.command("add")
def eval_sets_add(name: str, path: Path) -> None:
    """Register an eval file; every tenant's training data is checked for overlap with it."""
    from tuneforge.services.training import eval_sets

    ctx = platform()
    try:
        key = eval_sets.add_platform_eval_set(ctx.store, name, path)
        with ctx.db.session() as session:
            audit_service.operator_command(session, "add_eval_set", "eval-sets", name)
    except ApiError as exc:
        fail(exc)
    console.print(f"eval set {name}: {key}")
