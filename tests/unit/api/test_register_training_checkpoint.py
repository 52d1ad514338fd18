"""`POST /v1/models`: a training-API checkpoint registered as a fine-tuned model. Where the platform
evaluates models by default the registered model cannot reach staging without an admin override;
the same save registers once; a replaced base, another tenant's path, a bad suffix are refused by
name; the download is the adapter's files, as registered. (The whole flow — chat, download, a job
continuing it — runs in tests/e2e/test_training_api.py.)"""

from __future__ import annotations

import io
import tarfile

from tests.helpers.training_api import saved_training_checkpoint, tenant_named


def tenant_id(world, name: str) -> str:
    return tenant_named(world.platform, name)


def save_checkpoint(world, tenant: str, name: str, *, time: str, base_sha256: str | None = None) -> str:
    return saved_training_checkpoint(world.platform, world.base_model, tenant, name, time=time, base_sha256=base_sha256)


def register(world, key: str, **body):
    return world.http.post("/v1/models", json=body, headers=world.headers(key))


def test_a_registered_checkpoint_is_gated_registers_once_and_downloads_its_adapter(world) -> None:
    assert world.platform.settings.eval_by_default  # the platform evaluates every job's model by default
    alpha = tenant_id(world, "alpha")
    path = save_checkpoint(world, alpha, "first", time="2026-11-30T00:00:00Z")
    answer = register(world, world.key_a, source=path, suffix="mine")
    assert answer.status_code == 200, answer.text
    model = answer.json()
    assert model["id"].startswith(f"ft:{world.base_model}:alpha:mine:") and len(model["id"].rsplit(":", 1)[1]) == 8
    assert model["lineage"]["lora"] == {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["k_proj", "q_proj"]}
    assert model["promotable"] is False and "not evaluated" in model["gate_failures"][0]
    assert "prefix" not in model["lineage"]["artifact"]  # where it is stored is the platform's business

    assert register(world, world.key_a, source=path).json()["id"] == model["id"]  # the same save: once
    again = save_checkpoint(world, alpha, "first", time="2026-11-30T01:00:00Z")  # overwritten: a new model
    assert register(world, world.key_a, source=again).json()["id"] != model["id"]

    staging = world.http.post(f"/v1/models/{model['id']}/promote", json={"stage": "staging"},
                              headers=world.headers(world.key_a))
    assert staging.status_code == 409 and staging.json()["error"]["code"] == "model_not_evaluated"
    # nothing evaluated it: there is no failed gate for an admin to override either
    world.platform.settings.admin_api_key = "adm"
    override = world.http.post(f"/v1/admin/models/{model['id']}/promote", headers=world.headers("adm"),
                               json={"stage": "staging", "override": True, "reason": "trust me"})
    assert override.status_code == 409 and override.json()["error"]["code"] == "model_not_evaluated"

    download = world.http.get(f"/v1/models/{model['id']}/download", headers=world.headers(world.key_a))
    assert download.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(download.content)) as archive:
        names = sorted(name.rsplit("/", 1)[1] for name in archive.getnames())
        weights = archive.extractfile(next(n for n in archive.getnames() if n.endswith(".safetensors"))).read()
    assert names == ["adapter_config.json", "adapter_model.safetensors"]  # not the training state
    assert weights == b"weights of first at 2026-11-30T00:00:00Z"  # a copy: the checkpoint's later save is not it

    # an artifact changed behind the registry's back is refused, not served
    with world.platform.db.session() as session:
        from tuneforge.db.repos import models as model_repo

        row = model_repo.get(session, alpha, model["id"])
        world.platform.store.put_bytes(f"{row.artifact_prefix}/adapter_model.safetensors", b"tampered")
    tampered = world.http.get(f"/v1/models/{model['id']}/download", headers=world.headers(world.key_a))
    assert tampered.status_code == 409 and tampered.json()["error"]["code"] == "artifact_modified"


def test_what_cannot_be_registered_is_refused_naming_the_field(world) -> None:
    alpha = tenant_id(world, "alpha")
    path = save_checkpoint(world, alpha, "mine", time="2026-11-30T00:00:00Z")
    for source in ("/etc/passwd", "tinker://x/other/y", "tinker://../weights/x/../../y", "tinker://../weights/x",
                   "tinker://a/weights/..", ""):
        refused = register(world, world.key_a, source=source)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "source", source
    elsewhere = register(world, world.key_b, source=path)  # another tenant's path: looked up under its own
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["param"] == "source"
    bad_suffix = register(world, world.key_a, source=path, suffix="a:b")
    assert bad_suffix.status_code == 400 and bad_suffix.json()["error"]["param"] == "suffix"
    unknown = world.http.post("/v1/models", json={"source": path, "stage": "production"},
                              headers=world.headers(world.key_a))
    assert unknown.status_code == 400
    replaced = save_checkpoint(world, alpha, "old-base", time="2026-11-30T00:00:00Z", base_sha256="0" * 64)
    gone = register(world, world.key_a, source=replaced)
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "base_model_gone"
    assert world.http.post("/v1/models", json={"source": path}).status_code == 401
    listed = world.sdk(world.key_a).models.list().data
    assert not [m for m in listed if m.id.startswith("ft:")]  # nothing was registered by any of it
