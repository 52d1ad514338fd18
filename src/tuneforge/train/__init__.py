"""The trainer: `python -m tuneforge.train SPEC.json` runs one attempt of one job.

It never imports the control plane; it reads the base model and data from the
object store, writes checkpoints and artifacts there, and reports over HTTP.
"""
