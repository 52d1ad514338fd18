"""Hyperparameter sweeps: a search space over a job body, samplers, and early stopping."""
