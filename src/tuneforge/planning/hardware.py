"""Which GPUs a job may run on: its asked GPU type and least memory per GPU against what a
node reports (its GPU model and memory). Pure functions; the placement policy filters nodes
with `fits`, validation explains a job that fits nowhere with `why_nowhere`.

The matching rule (docs/scheduling.md):

- Names are compared normalised: lower case, letters and digits only ("NVIDIA A100-SXM4-80GB"
  is "nvidiaa100sxm480gb"; "a100-80gb", "A100 80GB" and "a100_80gb" are all "a100" + 80 GB).
- A type is a family plus, optionally, a memory suffix (`-80gb`, `-80g`, ` 80GB`): the family
  must be a substring of the node's normalised model ("a100" matches "NVIDIA A100-SXM4-80GB",
  "h100" matches "NVIDIA H100 80GB HBM3"); the suffix is a least memory per GPU like
  `gpu_memory_gb` (a node reporting 79.6 GiB counts as an 80 GB GPU: `NOMINAL_SLACK`), or, on a
  node that does not report its memory, must appear in its model name.
- Memory: the node's GPUs have at least the job's least memory per GPU.
- What a node does not report is not held against it: a node without a model matches any type,
  a node without a memory any memory — inventories from before nodes reported hardware (and
  CPU-only hosts) keep placing every job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tuneforge.domain.resolved import ResolvedResources

# Memory asks are nominal GB, as GPUs are sold; nodes report usable GiB (NVML), a little less: an
# "80GB" H100 says 79.6, a "24GB" L4 22.5 (93.7%). A node has a nominal N GB when it reports at least
# NOMINAL_SLACK * N; a need the memory model computed in GiB is made nominal (`nominal_gb`) so that
# the same comparison holds it exactly.
NOMINAL_SLACK = 0.93
_EPSILON_GB = 1e-6
_SUFFIX = re.compile(r"^(?P<family>.*?)[\s_-]*(?P<gb>\d+(?:\.\d+)?)\s*g(?:i?b)?$", re.IGNORECASE)
_ANY = {"", "any", "default"}
_NAMED_MEMORY = re.compile(r"(\d+)\s*gi?b?(?![a-z0-9])", re.IGNORECASE)  # "80GB" in "NVIDIA A100-SXM4-80GB"


def nominal_gb(gib: float) -> float:
    """The nominal memory that holds `gib` GiB by the matching rule (see NOMINAL_SLACK)."""
    return gib / NOMINAL_SLACK


def normalise(name: str) -> str:
    """Lower case, letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class GpuAsk:
    """A job's hardware ask: a normalised family ("" any) and a least memory per GPU (0 any)."""

    family: str = ""
    memory_gb: float = 0.0

    @classmethod
    def parse(cls, gpu_type: str | None, memory_gb: float = 0.0) -> GpuAsk:
        """From `resources.gpu_type` and the least memory per GPU; a memory suffix of the type
        raises the memory to it."""
        text = (gpu_type or "").strip()
        if normalise(text) in _ANY:
            return cls("", max(0.0, memory_gb))
        found = _SUFFIX.match(text)
        if found and normalise(found["family"]):
            return cls(normalise(found["family"]), max(memory_gb, float(found["gb"])))
        return cls(normalise(text), max(0.0, memory_gb))

    @property
    def any(self) -> bool:
        return not self.family and self.memory_gb <= 0

    def type_matches(self, model: str) -> bool:
        """The node's GPU model is of this family ("" on either side: yes)."""
        model = normalise(model)
        return not self.family or not model or self.family in model

    def memory_fits(self, node_memory_gb: float, model: str = "") -> bool:
        if self.memory_gb <= 0:
            return True
        if node_memory_gb > 0:
            return node_memory_gb + _EPSILON_GB >= self.memory_gb * NOMINAL_SLACK
        named = _NAMED_MEMORY.search(model) if model else None
        return named is None or float(named.group(1)) >= self.memory_gb

    def fits(self, model: str, node_memory_gb: float) -> bool:
        return self.type_matches(model) and self.memory_fits(node_memory_gb, model)


def hardware_ask(resources: ResolvedResources) -> GpuAsk:
    """The GPUs a planned job needs: the type it asked for and its least memory per GPU (what it
    asked or what its plan needs, `ResolvedResources.min_gpu_memory_gb`)."""
    return GpuAsk.parse(resources.required_gpu_type, resources.min_gpu_memory_gb)


@dataclass(frozen=True)
class NodeHardware:
    """What a node reports: its name, its GPUs' model and memory ("" and 0: unknown)."""

    name: str
    gpu_model: str = ""
    gpu_memory_gb: float = 0.0


def why_nowhere(ask: GpuAsk, nodes: Iterable[NodeHardware]) -> tuple[str, str] | None:
    """(param, why) when no node of a known inventory matches the ask, or None. Nodes that
    report nothing match (see the module docstring), so only an inventory that reports its
    hardware refuses anything."""
    nodes = list(nodes)
    if ask.any or not nodes:
        return None
    typed = [n for n in nodes if ask.type_matches(n.gpu_model)]
    if not typed:
        models = sorted({n.gpu_model for n in nodes})
        return ("resources.gpu_type", f"no GPUs of type {ask.family!r} here: the nodes have "
                                      f"{', '.join(models)}")
    if any(ask.memory_fits(n.gpu_memory_gb, n.gpu_model) for n in typed):
        return None
    largest = max(n.gpu_memory_gb for n in typed)
    where = ", ".join(f"{n.name}: {n.gpu_model or 'unknown model'}" for n in typed if n.gpu_memory_gb == largest)
    kind = f" of type {ask.family!r}" if ask.family else ""
    return ("resources.gpu_memory_gb", f"needs {_gb(ask.memory_gb)} GB per GPU; the largest GPUs{kind} here "
                                       f"have {_gb(largest)} GB ({where})")


def _gb(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def planning_memory_gb(ask: GpuAsk, nodes: Iterable[NodeHardware]) -> float | None:
    """The memory to plan a job for when it names none: the smallest reported memory among
    the nodes that match its ask, so that the plan fits every GPU it may land on; None when no such
    node reports its memory (the platform's TUNEFORGE_GPU_MEMORY_GB then)."""
    known = [n.gpu_memory_gb for n in nodes if n.gpu_memory_gb > 0 and ask.fits(n.gpu_model, n.gpu_memory_gb)]
    return min(known) if known else None
