"""Loading a base model straight into FSDP2 shards: no rank ever holds more of the base's weights
than its own shard, in host or device memory.

1. `skeleton`: the model is built on the `meta` device (no memory, no initialisation), except
   what a checkpoint does not hold and the architecture computes — the rotary embeddings'
   frequency buffers — which are rebuilt on the CPU from the config. Its parameter names are
   matched against the safetensors files first; a model whose names do not match (an
   architecture whose checkpoint names are converted on load) is loaded the whole way instead.
2. The adapter (LoRA) is added as it always is, and `adapter_snapshots` copies its freshly
   initialised weights aside before PEFT moves them to the meta device: they are drawn from the
   same seeded generator in the same order as in the unsharded path, so every rank starts with
   the same adapter, and the same one a single process would.
3. `host_states`: those weights and the buffers are set aside (they are small), FSDP2 shards the
   meta model (train/distributed.py), and `materialize` gives every parameter its shard's memory on
   the device and fills it: base weights read from the safetensors files by slice — only this
   rank's rows of each tensor are read (the files are memory-mapped) — and the adapter's and the
   buffers' values from what was set aside.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


def checkpoint_files(base_dir: Path) -> dict[str, Path] | None:
    """Tensor name -> the safetensors file holding it; None when the folder has no safetensors."""
    base_dir = Path(base_dir)
    index = base_dir / _INDEX
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: base_dir / file for name, file in weight_map.items()}
    single = base_dir / _SINGLE
    if not single.exists():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return {name: single for name in handle.keys()}


def checkpoint_name(name: str) -> str:
    """The checkpoint's name of a parameter of the (possibly PEFT-wrapped) model."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace(".base_layer.", ".")


def skeleton(base_dir: Path, dtype: torch.dtype, attn_implementation: str | None = None) -> Any | None:
    """The model on the meta device with real buffers, or None where it cannot be loaded so
    (no safetensors, names that do not match the checkpoint's, a buffer it cannot rebuild)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    files = checkpoint_files(base_dir)
    if files is None:
        log.info("sharded loading not used: no safetensors files in the base model")
        return None
    config = AutoConfig.from_pretrained(base_dir)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    missing = [name for name, _ in model.named_parameters() if _source_name(name, files, model) is None]
    if missing:
        log.info("sharded loading not used: %d parameters are not in the checkpoint by name (e.g. %s)",
                 len(missing), missing[0])
        return None
    if not _rebuild_buffers(model):
        return None
    return model


def _source_name(name: str, files: dict[str, Path], model: Any) -> str | None:
    key = checkpoint_name(name)
    if key in files:
        return key
    # tied output layer: the checkpoint keeps the input embeddings only
    if key.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False):
        for candidate in files:
            if candidate.endswith("embed_tokens.weight"):
                return candidate
    return None


def _rebuild_buffers(model: Any) -> bool:
    """Give every module whose buffers are on the meta device real ones, built again on the CPU
    from its config (the rotary embeddings: `type(module)(config)` makes no parameters)."""
    for name, module in model.named_modules():
        meta = [key for key, buffer in module.named_buffers(recurse=False) if buffer is not None and buffer.is_meta]
        if not meta:
            continue
        config = getattr(module, "config", None)
        if config is None or any(True for _ in module.parameters(recurse=False)):
            log.info("sharded loading not used: buffers %s of %s cannot be rebuilt", meta, name or "the model")
            return False
        try:
            fresh = type(module)(config)
        except Exception as exc:  # noqa: BLE001 - an architecture whose module needs more than its config
            log.info("sharded loading not used: %s cannot be rebuilt from its config (%s)", name, exc)
            return False
        for key in meta:
            module._buffers[key] = fresh._buffers[key]
        for attr, value in vars(fresh).items():  # plain attributes computed with them (attention_scaling)
            if not attr.startswith("_") and not isinstance(value, torch.nn.Module):
                setattr(module, attr, value)
    return True


@contextlib.contextmanager
def adapter_snapshots() -> Iterator[dict[int, dict[str, torch.Tensor]]]:
    """While PEFT adds adapters to a meta base: each adapter layer's freshly initialised weights,
    cast to the base's dtype as PEFT casts them, are copied aside (by the layer's identity) before
    PEFT moves them to the base layer's meta device, where their values would be lost."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    original = BaseTunerLayer._move_adapter_to_device_of_base_layer
    taken: dict[int, dict[str, torch.Tensor]] = {}

    def move(self: Any, adapter_name: str, device: torch.device | None = None) -> None:
        weight = getattr(self.get_base_layer(), "weight", None)
        on_meta = device is None and weight is not None and weight.is_meta
        original(self, adapter_name, torch.device("cpu") if on_meta else device)
        if on_meta:
            taken.setdefault(id(self), {}).update(_adapter_tensors(self, adapter_name))

    BaseTunerLayer._move_adapter_to_device_of_base_layer = move  # type: ignore[method-assign]
    try:
        yield taken
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = original  # type: ignore[method-assign]


def _adapter_tensors(layer: Any, adapter_name: str) -> dict[str, torch.Tensor]:
    """The adapter's parameters in `layer`, by their names relative to it."""
    found: dict[str, torch.Tensor] = {}
    for attr in (*layer.adapter_layer_names, *layer.other_param_names):
        container = getattr(layer, attr, None)
        if not isinstance(container, (torch.nn.ModuleDict, torch.nn.ParameterDict)) or adapter_name not in container:
            continue
        item = container[adapter_name]
        if isinstance(item, torch.nn.Module):
            for name, param in item.named_parameters():
                found[f"{attr}.{adapter_name}.{name}"] = param.detach().clone()
        elif isinstance(item, torch.Tensor):
            found[f"{attr}.{adapter_name}"] = item.detach().clone()
    return found


def host_states(model: Any, snapshots: dict[int, dict[str, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
    """What `materialize` puts back after FSDP2 gives the model its memory, by name: the adapter
    weights `adapter_snapshots` took, the parameters that are not on the meta device, and every
    buffer."""
    kept = {name: param.detach().clone() for name, param in model.named_parameters() if not param.is_meta}
    for module_name, module in model.named_modules():
        for relative, tensor in (snapshots or {}).get(id(module), {}).items():
            kept[f"{module_name}.{relative}"] = tensor
    kept.update({f"buffer:{name}": buffer.detach().clone() for name, buffer in model.named_buffers()})
    return kept


def materialize(model: Any, base_dir: Path, device: torch.device, dtype: torch.dtype,
                kept: dict[str, torch.Tensor]) -> int:
    """Memory on `device` for the sharded model, filled: base weights from the checkpoint (this
    rank's rows only), the rest from `kept`. Returns the bytes of base weights this rank read.

    The safetensors files are mapped, not read: a tensor of the checkpoint is a view of the mapped
    file, and copying this rank's rows from it touches only their pages — no temporary copy of a
    whole tensor (whose freed memory the C allocator would keep, several of them at once)."""
    files = checkpoint_files(base_dir)
    assert files is not None
    model.to_empty(device=device)
    read = 0
    mapped: dict[Path, _Mapped] = {}
    try:
        with torch.no_grad():
            for name, param in model.named_parameters():
                local, rows = _local_rows(param)
                if name in kept:
                    source = kept[name]
                    local.copy_(source[rows[0]:rows[1]] if rows else source)
                    continue
                key = _source_name(name, files, model)
                assert key is not None
                path = files[key]
                if path not in mapped:
                    mapped[path] = _Mapped(path)
                whole = mapped[path].tensor(key)
                part = whole[rows[0]:rows[1]] if rows else whole
                read += part.numel() * part.element_size()
                local.copy_(part)
                mapped[path].release(key)  # its pages leave this process's memory again
            for name, buffer in model.named_buffers():
                saved = kept.get(f"buffer:{name}")
                if saved is not None:
                    buffer.copy_(saved)
    finally:
        for opened in mapped.values():
            opened.close()
    return read


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class _Mapped:
    """A safetensors file mapped into memory (copy-on-write: nothing is ever written back), its
    tensors as views of the mapping."""

    def __init__(self, path: Path) -> None:
        import mmap

        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        length = int.from_bytes(self._map[:8], "little")
        self._header = json.loads(self._map[8:8 + length])
        self._data = 8 + length

    def tensor(self, key: str) -> torch.Tensor:
        entry = self._header[key]
        start, end = entry["data_offsets"]
        dtype = _DTYPES[entry["dtype"]]
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(self._map, dtype=dtype, count=count, offset=self._data + start)
        return flat.view(entry["shape"])

    def release(self, key: str) -> None:
        """Drop the mapped pages of tensor `key` from this process (they are read again from the
        file if touched again): what was copied out of them is not counted twice."""
        import mmap

        start, end = self._header[key]["data_offsets"]
        first = (self._data + start) // mmap.PAGESIZE * mmap.PAGESIZE
        last = min(len(self._map), -(-(self._data + end) // mmap.PAGESIZE) * mmap.PAGESIZE)
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # a view still exported: the mapping goes with its last tensor
            pass
        self._file.close()


def _local_rows(param: Any) -> tuple[torch.Tensor, tuple[int, int] | None]:
    """The tensor this rank holds of `param` and the rows of the whole it covers (None: all of it)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.data, None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    local = param.to_local()
    if len(shape) == 0:
        return local, None
    return local, (offset[0], offset[0] + shape[0])
