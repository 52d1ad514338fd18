"""Post-training evaluation: task metrics, refusal detection, gates and the
platform's shipped eval sets (pure Python), plus the torch runner the trainer
calls (`runner.py`)."""
