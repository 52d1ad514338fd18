"""Every loaded adapter of one base, stacked per layer, so that a batch whose rows use different
adapters costs two batched matrix products per LoRA layer whatever the number of adapters.

PEFT still loads and holds the adapters (`load_adapter`, `delete_adapter`); it no longer
computes with them: its LoRA layers are switched off, and a forward hook on each adds the
adapters' part. For a layer with input x (one row per sequence) the hook computes, for row i
with adapter slot s(i):

    delta_i = ((x_i @ A[s(i)]^T) @ B[s(i)]^T) * scaling[s(i)]

where A [slots, r_max, in] and B [slots, out, r_max] stack every adapter's lora_A and lora_B
(zero-padded to the largest rank; zeros too where an adapter does not adapt the layer) and slot 0
is the base alone (all zeros). Each row gathers its own A and B (the grouped matrix-vector
product of S-LoRA / Punica, written with `torch.bmm`). PEFT's own mixed-adapter forward
(`adapter_names`) loops over the adapters of the batch in Python for every layer, which grows
with the number of adapters (benchmarks/inference.py measures both).

Only plain LoRA on linear layers is stacked (what the trainer produces). A model with any other
LoRA layer (DoRA, embeddings, convolutions) keeps PEFT's computation (`usable` is False).
"""

from __future__ import annotations

from typing import Any

import torch


class LoraBank:
    def __init__(self, peft_model: Any) -> None:
        self.model = peft_model
        self.layers: list[Any] = []  # PEFT's LoRA layers, each with the hook
        self.usable = True
        self.slots: dict[str, int] = {}  # adapter name -> its row in every stack; 0: none
        self.rows: torch.Tensor | None = None  # the slot of each row of the forward pass under way
        self.uniform: int | None = None  # the slot of every row, when they all have the same one
        self._stacks: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = {}
        self._stale = True

    def changed(self) -> None:
        """Adapters were loaded or deleted: the stacks are rebuilt before the next forward pass."""
        self._stale = True

    def prepare(self, adapters: list[str]) -> bool:
        """Stacks for exactly `adapters` (in slot order 1, 2, ...), PEFT's own LoRA computation off.
        False: some loaded adapter cannot be stacked; PEFT computes, as it was left."""
        if not self._stale and list(self.slots) == adapters:
            return self.usable
        from peft.tuners.lora.layer import LoraLayer
        from peft.tuners.lora.layer import Linear as LoraLinear

        hooked = {id(layer) for layer in self.layers}
        for module in self.model.modules():  # a new adapter may adapt layers no earlier one did
            if isinstance(module, LoraLayer) and id(module) not in hooked:
                self.layers.append(module)
                module.register_forward_hook(self._add_adapters)
        self.usable = all(type(layer) is LoraLinear for layer in self.layers) and not any(
            layer.use_dora.get(name, False) for layer in self.layers for name in adapters)
        self.slots = {name: index + 1 for index, name in enumerate(adapters)}
        self._stacks = {}
        for layer in self.layers:
            layer.enable_adapters(not self.usable)  # off: the hooks compute; on: PEFT does
            if self.usable:
                self._stacks[id(layer)] = self._stack(layer)
        self._stale = False
        return self.usable

    def select(self, adapters: list[str | None], device: torch.device) -> None:
        """The adapter of each row of the next forward pass (None: the base alone)."""
        slots = [self.slots[name] if name is not None else 0 for name in adapters]
        self.uniform = slots[0] if len(set(slots)) == 1 else None
        self.rows = None if self.uniform == 0 else torch.tensor(slots, dtype=torch.long, device=device)

    def clear(self) -> None:
        self.rows, self.uniform = None, None

    def _stack(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        present = [(slot, name) for name, slot in self.slots.items() if name in layer.lora_A]
        if not present:
            return None
        first = layer.lora_A[present[0][1]].weight
        rank = max(layer.lora_A[name].weight.shape[0] for _slot, name in present)
        count = len(self.slots) + 1
        in_features, out_features = first.shape[1], layer.lora_B[present[0][1]].weight.shape[0]
        a = torch.zeros(count, rank, in_features, dtype=first.dtype, device=first.device)
        b = torch.zeros(count, out_features, rank, dtype=first.dtype, device=first.device)
        scaling = torch.zeros(count, dtype=torch.float32, device=first.device)
        with torch.no_grad():
            for slot, name in present:
                lora_a, lora_b = layer.lora_A[name].weight, layer.lora_B[name].weight
                a[slot, :lora_a.shape[0]] = lora_a
                b[slot, :, :lora_b.shape[1]] = lora_b
                scaling[slot] = float(layer.scaling[name])
        return a, b, scaling

    def _add_adapters(self, layer: Any, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        if rows is None:
            return output
        stacks = self._stacks.get(id(layer))
        if stacks is None:
            return output
        a, b, scaling = stacks
        x = inputs[0].to(a.dtype)  # [rows, positions, in]
        if self.uniform is not None:  # one adapter for all: its own matrices, nothing gathered
            slot = self.uniform
            delta = (x @ a[slot].T) @ b[slot].T * scaling[slot].to(a.dtype)
        else:
            hidden = torch.bmm(x, a[rows].transpose(1, 2))  # [rows, positions, rank]
            delta = torch.bmm(hidden, b[rows].transpose(1, 2)) * scaling[rows].view(-1, 1, 1).to(a.dtype)
        return output + delta.to(output.dtype)
