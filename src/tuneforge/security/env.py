"""The environment of every subprocess the platform starts, built from an allow-list, and the
modes of the files the platform writes (its user's only).

A trainer runs tenant-chosen code paths (data, eval endpoints, chat templates);
it must not inherit the control plane's environment, which holds the admin
key, the database URL with its password, cloud credentials. A child gets only:

- what the interpreter, torch, CUDA/NCCL, Hugging Face and the C library need
  to run (`_PASSED` names and `_PASSED_PREFIXES`),
- what the caller adds explicitly (the store's settings, the node name, rank
  variables), which is the only way a TUNEFORGE_* value reaches a child.

Nothing else passes, whatever its name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO

# exact names passed through when set
_PASSED = frozenset({
    # the process and its interpreter
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "SHELL", "TERM",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER",
    "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD",
    # caches the libraries write to (models come from the object store, never a hub)
    "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM",
    # threads
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    # GPUs
    "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF", "BNB_CUDA_VERSION",
    # the platform's own, non-secret: peak FLOP/s for MFU, data workers (the egress allow-list is
    # passed explicitly, from the settings: Settings.trainer_env)
    "TUNEFORGE_GPU_PEAK_TFLOPS", "TUNEFORGE_DATA_WORKERS", "TUNEFORGE_SHARDED_LOAD",
})
# prefixes passed through: collective communication and torch's own switches
_PASSED_PREFIXES = ("NCCL_", "TORCH_", "LC_")


def child_env(extra: Mapping[str, str] | None = None, *, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess: the allow-listed variables of `parent` (default this
    process's environment) and then `extra`, which the caller chose on purpose."""
    source = os.environ if parent is None else parent
    env = {name: value for name, value in source.items() if passes(name)}
    if extra:
        env.update({name: str(value) for name, value in extra.items()})
    return env


def passes(name: str) -> bool:
    """Whether a variable of this name is passed to children without being asked for."""
    return name in _PASSED or name.startswith(_PASSED_PREFIXES)


def restrict_umask() -> None:
    """Files and folders this process creates are its user's only (0600 / 0700): databases,
    logs, attempt specs (with job tokens), caches of tenants' models and data."""
    os.umask(0o077)


def private_dirs(folder: Path) -> None:
    """`folder` and the parents it lacks, each made 0700 (mkdir's `mode` skips parents and is
    narrowed by the umask only)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another writer
            continue
        os.chmod(path, 0o700)


def open_private(path: Path, mode: str = "wb") -> IO:
    """`path` opened for writing ("wb", "w") or appending ("ab"), created 0600 if it is new."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, 0o600), mode)
