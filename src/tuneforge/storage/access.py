"""Which objects one trainer attempt may reach through the control plane's object proxy
(api/routes/objects.py), decided from the keys its JobSpec names. The one rule for it.

A trainer reads and writes:

- its own job's folder (`layout.job_prefix`): checkpoints, artifacts, results.csv, tracking files,
  the parent adapter copied under it when the job was created;
- its data files (training, validation, the eval's task file): read, each exactly that key;
- beside each data file, the caches any job of the same tenant may share: the tokenized copy of a
  prepared dataset file (`layout.tokenized_key`, read and written) and the reference model's
  log-probabilities of a preference file (`layout.reference_logps_key`, read and written);
- the weights it starts from (`BaseModelRef.prefix`: a registered base model, or the final model
  of the full fine-tune it continues) and a parent adapter named by prefix: read only.

Nothing else: not another job's folder, not another file of its tenant, not another tenant's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tuneforge.domain.spec import JobSpec
from tuneforge.storage import layout

# the name tokenized caches take inside a prepared dataset's folder (`layout.tokenized_key`)
_TOKENIZED_FOLDER = "tokenized"
# what a reference log-probability cache's key adds to its data file's (`layout.reference_logps_key`)
_REFERENCE_SUFFIX = ".reference-logps-"


class KeyRefused(ValueError):
    """A key outside what the attempt may reach, or not a key at all."""


def clean_key(key: str) -> str:
    """`key` without its surrounding slashes; KeyRefused for an empty key or one with a `..`,
    `.` or empty segment (which a folder store would resolve elsewhere)."""
    cleaned = key.strip("/")
    parts = cleaned.split("/")
    if not cleaned or any(part in ("", ".", "..") for part in parts) or "\\" in cleaned:
        raise KeyRefused(f"invalid object key {key!r}")
    return cleaned


def _folder(prefix: str) -> str:
    return prefix.strip("/") + "/"


@dataclass(frozen=True)
class ObjectScope:
    """What one attempt may reach: whole folders to read and write, folders to read, single keys
    to read, and key beginnings (not folders) to read and write."""

    writable_folders: tuple[str, ...] = ()
    readable_folders: tuple[str, ...] = ()
    readable_keys: frozenset[str] = frozenset()
    writable_starts: tuple[str, ...] = ()

    def may_read(self, key: str) -> bool:
        key = clean_key(key)
        return key in self.readable_keys or self._may_write(key) or \
            key.startswith(tuple(_folder(f) for f in self.readable_folders))

    def may_write(self, key: str) -> bool:
        return self._may_write(clean_key(key))

    def _may_write(self, key: str) -> bool:
        return key.startswith(tuple(_folder(f) for f in self.writable_folders)) or \
            any(key.startswith(start) and len(key) > len(start) for start in self.writable_starts)

    def may_list(self, prefix: str) -> bool:
        """Whether every key a listing of `prefix` could answer is one this attempt may read: the
        prefix lies inside one of its folders (listing the store's root, or a tenant's, is refused,
        not filtered: its cost would be the whole store's)."""
        folder = _folder(clean_key(prefix))
        return folder.startswith(tuple(_folder(f) for f in self.writable_folders + self.readable_folders))


def job_scope(tenant_id: str, job_id: str, *, data_keys: Iterable[str], model_prefixes: Iterable[str]) -> ObjectScope:
    """The scope of an attempt of `job_id`: its folder, its data files (`data_keys`) and their
    caches, and the weights it starts from (`model_prefixes`)."""
    keys = frozenset(clean_key(key) for key in data_keys if key)
    writable_folders = [layout.job_prefix(tenant_id, job_id)]
    starts = []
    for key in sorted(keys):
        starts.append(key + _REFERENCE_SUFFIX)
        if layout.tokenized_key(key, "x") is not None:  # a prepared dataset's file: its folder's caches
            writable_folders.append(f"{key.rpartition('/')[0]}/{_TOKENIZED_FOLDER}")
    readable = tuple(sorted({clean_key(prefix) for prefix in model_prefixes if prefix}))
    return ObjectScope(writable_folders=tuple(writable_folders), readable_folders=readable,
                       readable_keys=keys, writable_starts=tuple(starts))


def spec_scope(spec: JobSpec) -> ObjectScope:
    """The scope of the attempt a JobSpec describes (the control plane builds the same from the
    job's rows: services/training/objects.py)."""
    validation = spec.validation_file.key if spec.validation_file else ""
    task = (spec.eval.task_file_key if spec.eval is not None else None) or ""
    return job_scope(spec.tenant_id, spec.job_id, data_keys=[spec.training_file.key, validation, task],
                     model_prefixes=[spec.base_model.prefix, spec.init_adapter_prefix])
