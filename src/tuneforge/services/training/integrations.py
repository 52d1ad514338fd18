"""A job's experiment-tracking integrations: checked at create, and what its trainer needs.

- `tensorboard` (extension): no settings; event files beside the job.
- `wandb` (OpenAI's): project, name, entity, tags. The run goes to the operator's W&B
  server (TUNEFORGE_WANDB_BASE_URL) with the tenant's own API key, a tenant secret
  (`api_key_secret`, default the secret named WANDB_API_KEY), never a key of the platform's.
  The operator may run it offline instead (TUNEFORGE_WANDB_MODE=offline): the run is written
  as W&B offline files kept beside the job, and no key is needed.
- `mlflow` (extension): an http(s) tracking server of the tenant's (`tracking_uri`, checked by
  the egress policy here and again at connect time in the trainer), with credentials as
  tenant secrets; or, without `tracking_uri`, the operator's TUNEFORGE_MLFLOW_TRACKING_URI
  (which may be a file or database store: it is the operator's, never a tenant's path).

The trainer asks for `access_for` once per attempt with its job token (the /credentials
report); nothing is put in its environment.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from tuneforge.db.repos import secrets as secret_repo
from tuneforge.db.tables import Job
from tuneforge.domain.errors import invalid
from tuneforge.domain.job_config import JobRequest
from tuneforge.security.crypto import Sealer
from tuneforge.security.egress import EgressPolicy
from tuneforge.services.tenancy import secrets as secret_service
from tuneforge.settings import Settings

KINDS = ("tensorboard", "wandb", "mlflow")
WANDB_KEY_SECRET = "WANDB_API_KEY"  # the secret a wandb integration's key is read from by default
_MLFLOW_SECRETS = {"token_secret": "token", "username_secret": "username", "password_secret": "password"}


def check_static(settings: Settings, request: JobRequest) -> None:
    """Shapes, the operator's settings and the egress policy: 400 naming the field."""
    seen: set[str] = set()
    for index, item in enumerate(request.integrations or []):
        param = f"integrations.{index}"
        if item.type not in KINDS:
            raise invalid(f"{param}.type must be one of {', '.join(KINDS)}", param=f"{param}.type")
        if item.type in seen:
            raise invalid(f"the {item.type} integration is given twice", param=f"{param}.type")
        seen.add(item.type)
        for other in KINDS:
            if other != item.type and getattr(item, other) is not None:
                raise invalid(f"{param}.{other} does not belong to a {item.type} integration",
                              param=f"{param}.{other}")
        if item.type == "tensorboard" and item.tensorboard:
            raise invalid(f"{param}.tensorboard takes no settings", param=f"{param}.tensorboard")
        if item.type == "wandb":
            _check_wandb(settings, item, param)
        if item.type == "mlflow":
            _check_mlflow(settings, item, param)


def _check_wandb(settings: Settings, item: Any, param: str) -> None:
    if settings.wandb_mode == "off":
        raise invalid("the wandb integration is turned off on this platform; use 'mlflow' or 'tensorboard'",
                      param=f"{param}.type", code="unsupported_integration")
    if item.wandb is None:
        raise invalid(f"{param}.wandb is required: at least its project", param=f"{param}.wandb")


def _check_mlflow(settings: Settings, item: Any, param: str) -> None:
    given = item.mlflow
    if given is None or given.tracking_uri is None:
        if not settings.mlflow_tracking_uri:
            raise invalid(f"this platform has no MLflow tracking server of its own: give "
                          f"{param}.mlflow.tracking_uri (an http(s) URL)", param=f"{param}.mlflow.tracking_uri",
                          code="unsupported_integration")
        if given is not None and any(getattr(given, name) for name in _MLFLOW_SECRETS):
            raise invalid(f"{param}.mlflow: credentials go with a tracking_uri of your own; the platform's "
                          "server needs none from you", param=f"{param}.mlflow.tracking_uri")
    else:
        uri_param = f"{param}.mlflow.tracking_uri"
        if urlsplit(given.tracking_uri.strip()).scheme.lower() not in ("http", "https"):
            raise invalid(f"{uri_param} must be an http(s) URL of an MLflow tracking server", param=uri_param,
                          code="invalid_url")
        EgressPolicy.from_settings(settings).check_url(given.tracking_uri, param=uri_param)
        if given.token_secret and (given.username_secret or given.password_secret):
            raise invalid(f"{param}.mlflow: give a token_secret or a username_secret and password_secret, not both",
                          param=f"{param}.mlflow.token_secret")
        if bool(given.username_secret) != bool(given.password_secret):
            raise invalid(f"{param}.mlflow: username_secret and password_secret go together",
                          param=f"{param}.mlflow.username_secret")


def check_secrets(session: Session, settings: Settings, tenant_id: str, request: JobRequest) -> None:
    """Every secret the integrations name exists; an online wandb run has a key to log with."""
    for index, item in enumerate(request.integrations or []):
        param = f"integrations.{index}.{item.type}"
        if item.type == "wandb" and item.wandb is not None:
            if item.wandb.api_key_secret:
                secret_service.require(session, tenant_id, item.wandb.api_key_secret, f"{param}.api_key_secret")
            elif settings.wandb_mode == "online" and secret_repo.get(session, tenant_id, WANDB_KEY_SECRET) is None:
                raise invalid(f"the wandb integration logs with your own W&B API key: store it as a secret named "
                              f"{WANDB_KEY_SECRET} (POST /v1/secrets) or name another in {param}.api_key_secret",
                              param=f"{param}.api_key_secret", code="secret_not_found")
        if item.type == "mlflow" and item.mlflow is not None:
            for field in _MLFLOW_SECRETS:
                name = getattr(item.mlflow, field)
                if name:
                    secret_service.require(session, tenant_id, name, f"{param}.{field}")


def access_for(session: Session, settings: Settings, sealer: Sealer, job: Job) -> dict[str, dict[str, Any]]:
    """What the trainer of `job` needs to reach its trackers: per integration, the server and the
    tenant's credentials its config names (its own tenant's only)."""
    found: dict[str, dict[str, Any]] = {}
    for item in job.request.integrations or []:
        if item.type == "wandb" and item.wandb is not None:
            name = item.wandb.api_key_secret or WANDB_KEY_SECRET
            key = secret_service.values(session, sealer, job.tenant_id, {name}).get(name)
            found["wandb"] = {"mode": settings.wandb_mode, "base_url": settings.wandb_base_url, "api_key": key}
        elif item.type == "mlflow":
            given = item.mlflow
            if given is not None and given.tracking_uri:
                names = {field: getattr(given, field) for field in _MLFLOW_SECRETS if getattr(given, field)}
                values = secret_service.values(session, sealer, job.tenant_id, set(names.values()))
                found["mlflow"] = {"tracking_uri": given.tracking_uri.strip(), "operator": False,
                                   **{_MLFLOW_SECRETS[field]: values.get(name) for field, name in names.items()}}
            elif settings.mlflow_tracking_uri:
                found["mlflow"] = {"tracking_uri": settings.mlflow_tracking_uri, "operator": True,
                                   "token": settings.mlflow_tracking_token}
    return found
