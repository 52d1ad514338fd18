"""Pure planning: the arithmetic the control plane decides with, and no I/O.

- `memory.py`: the memory model (what a job needs per GPU; the micro-batch that fits)
- `model_shape.py`: a base model's shape from its config (parameters, layers, LoRA targets)
- `hyperparams.py`: "auto" hyperparameters resolved into the values a trainer runs
- `policy.py`, `policy_inputs.py`, `ordering.py`: the scheduler's queue order and placement
- `pools.py`: the GPU pools a job may run in

Everything here takes values and returns values: no database, no object store,
no settings read, no torch. The services and the scheduler call it; tests and
benchmarks call it directly (`benchmarks/scheduler_sim.py`, `memory_estimate.py`).
"""
