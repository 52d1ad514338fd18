"""Every loaded adapter of one base, stacked per layer, so that a batch whose rows use different
adapters costs two batched matrix products per LoRA layer whatever the number of adapters.

PEFT still loads and holds the adapters (`load_adapter`, `delete_adapter`); it no longer
computes with them: its LoRA layers are switched off, and a forward hook on each adds the
adapters' part. For a layer with input x (one row per sequence) the hook computes, for row i
with adapter slot s(i):

    delta_i = ((x_i @ A[s(i)]^T) @ B[s(i)]^T) * scaling[s(i)]

where A [slots, r_max, in] and B [slots, out, r_max] stack every adapter's lora_A and lora_B
(zero-padded to the largest rank; zeros too where an adapter does not adapt the layer) and slot 0
is the base alone (all zeros). Two ways to compute it, by the size of the stacks:

- few adapters of small rank (slots x rank <= DENSE_LIMIT): x times every adapter's A at once
  (one dense product), each row keeping only its own slot's part (a one-hot mask carrying the
  scaling), then times every B side by side: more multiplications, but two dense products per
  layer, which is what a CPU or a GPU does best at these sizes;
- otherwise each row gathers its own A and B (the grouped matrix-vector product of S-LoRA /
  Punica, written with `torch.bmm`): the work stays that of one adapter per row however many
  adapters are loaded.

PEFT's own mixed-adapter forward (`adapter_names`) loops over the adapters of the batch in
Python in every layer, which grows with the number of adapters.

Only plain LoRA on linear layers is stacked (what the trainer produces). A model with any other
LoRA layer (DoRA, embeddings, convolutions) keeps PEFT's computation (`usable` is False).
"""

from __future__ import annotations

from typing import Any

import torch

# slots x rank at most this: a mixed batch multiplies by every adapter's matrices at once
DENSE_LIMIT = 1024


class LoraBank:
    def __init__(self, peft_model: Any) -> None:
        self.model = peft_model
        self.layers: list[Any] = []  # PEFT's LoRA layers, each with the hook
        self.usable = True
        self.slots: dict[str, int] = {}  # adapter name -> its row in every stack; 0: none
        self.rows: torch.Tensor | None = None  # the slot of each row of the forward pass under way
        self.uniform: int | None = None  # the slot of every row, when they all have the same one
        self._stacks: dict[int, tuple[torch.Tensor, ...] | None] = {}
        self._stale = True

    def changed(self) -> None:
        """Adapters were loaded or deleted: the stacks are rebuilt before the next forward pass."""
        self._stale = True

    def prepare(self, adapters: list[str]) -> bool:
        """Stacks for exactly `adapters` (in slot order 1, 2, ...), PEFT's own LoRA computation off.
        False: some loaded adapter cannot be stacked; PEFT computes, as it was left."""
        if not self._stale and list(self.slots) == adapters:
            return self.usable
        from peft.tuners.lora.layer import Linear as LoraLinear
        from peft.tuners.lora.layer import LoraLayer

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

    def activate(self, adapters: list[str | None], device: torch.device) -> None:
        """The adapter of each row of the next forward pass (None: the base alone)."""
        slots = [self.slots[name] if name is not None else 0 for name in adapters]
        self.uniform = slots[0] if len(set(slots)) == 1 else None
        self.rows = None if self.uniform == 0 else torch.tensor(slots, dtype=torch.long, device=device)

    def clear(self) -> None:
        self.rows, self.uniform = None, None

    def _stack(self, layer: Any) -> tuple[torch.Tensor, ...] | None:
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
        # every adapter's B side by side, [out, slots * rank], for the dense path
        return a, b, scaling, b.permute(1, 0, 2).reshape(out_features, count * rank).contiguous()

    def _add_adapters(self, layer: Any, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        if rows is None:
            return output
        stacks = self._stacks.get(id(layer))
        if stacks is None:
            return output
        a, b, scaling, b_side_by_side = stacks
        x = inputs[0].to(a.dtype)  # [rows, positions, in]
        if self.uniform is not None:  # one adapter for all: its own matrices, nothing gathered
            slot = self.uniform
            delta = (x @ a[slot].T) @ b[slot].T * scaling[slot].to(a.dtype)
        elif a.shape[0] * a.shape[1] <= DENSE_LIMIT:
            # few adapters of small rank: every adapter's A at once (one dense product), each row
            # keeping only its own adapter's part, then every B at once; cheaper than gathering
            # weights per row where the products are small (a CPU, a handful of adapters)
            slots, rank = a.shape[0], a.shape[1]
            hidden = (x @ a.reshape(slots * rank, -1).T).view(*x.shape[:2], slots, rank)
            own = torch.nn.functional.one_hot(rows, slots).to(a.dtype) * scaling.to(a.dtype)
            hidden = hidden * own.view(-1, 1, slots, 1)
            delta = hidden.view(*x.shape[:2], slots * rank) @ b_side_by_side.T
        else:  # each row gathers its own adapter's matrices (S-LoRA / Punica's grouped product)
            hidden = torch.bmm(x, a[rows].transpose(1, 2))  # [rows, positions, rank]
            delta = torch.bmm(hidden, b[rows].transpose(1, 2)) * scaling[rows].view(-1, 1, 1).to(a.dtype)
        return output + delta.to(output.dtype)
